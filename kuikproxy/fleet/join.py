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

    redis = settings.redis
    password = None
    if redis.password_file is not None:
        secret = await asyncio.to_thread(Path(redis.password_file).read_text, encoding="utf-8")
        password = secret.strip()
    # a pod's host name is its name: unique in the fleet, and the same after a restart, so a
    # restarted proxy takes its place in the turns rather than adding one
    name = settings.name or socket.gethostname()
    return await RedisFleet.connect(
        redis.url, name, password=password, tls_ca_file=redis.tls_ca_file
    )
