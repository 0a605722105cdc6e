"""The pure pacing core: no asyncio, no aiohttp, no clock reads; every function takes now."""
