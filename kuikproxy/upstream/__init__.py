"""The registry client: aiohttp to upstreams, foreign errors mapped into kuikproxy.errors."""
