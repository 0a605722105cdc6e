"""The runtime: timers at window times, held requests, one upstream read per image."""
