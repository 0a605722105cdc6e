"""Several kuikproxy processes sharing one registry budget.

:mod:`.backend` is the seam: what the runtime asks of a fleet — who may use a window of a host's
series, the series' shared origins, blocks, and how many proxies there are. :mod:`.redis` is the
Redis implementation (redis-py, asyncio), imported only when ``fleet`` is configured.
"""
