"""The aiohttp edge: routes, classification, streaming, /status."""
