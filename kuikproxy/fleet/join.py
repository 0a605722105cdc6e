"""Joining the fleet a config names (``fleet``): its Redis, this proxy's name."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from kuikproxy.config import FleetSettings
from kuikproxy.fleet.backend import FleetBackend


async def join(settings: FleetSettings) -> FleetBackend:
    # redis-py is imported here only: a proxy without a fleet never loads it
    from kuikproxy.fleet.redis import RedisFleet
    from kuikproxy.fleet.redisstore import RedisStore

    redis = settings.redis
    store = RedisStore(
        url=redis.url,
        cluster=redis.cluster,
        sentinels=redis.sentinel_addresses(),
        master_name=redis.master_name,
        username=redis.username,
        password=await _secret(redis.password_file),
        sentinel_password=await _secret(redis.sentinel_password_file),
        tls=redis.tls,
        tls_ca_file=redis.tls_ca_file,
    )
    # a pod's host name is its name: unique in the fleet, and the same after a restart, so a
    # restarted proxy takes its place in the turns rather than adding one
    name = settings.name or socket.gethostname()
    return await RedisFleet.connect(store, name, confirmed_by=redis.confirmed_by)


async def _secret(path: str | None) -> str | None:
    """A password from its file (a mounted Secret), without the line's end."""
    if path is None:
        return None
    secret = await asyncio.to_thread(Path(path).read_text, encoding="utf-8")
    return secret.strip()
