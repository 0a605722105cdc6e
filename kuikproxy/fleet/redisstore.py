"""The Redis a fleet runs on, as a redis-py client: one server (or a replicated primary), the
master Redis Sentinel names, or a Redis Cluster — each with the fleet's short timeouts, and
what ``/status.fleet.store`` says of it.

* **single**: ``redis.asyncio.from_url``.
* **sentinel**: ``Sentinel(...).master_for(name)``: each new connection asks the Sentinels for
  the master, and a connection to a master that became a replica is dropped (redis-py reads
  ``READONLY`` as a broken connection), so the fleet follows a failover at its next call.
* **cluster**: ``RedisCluster``, which learns the slots from the node in the URL and follows
  ``MOVED`` / ``ASK`` (and ``TRYAGAIN`` while a slot migrates) itself.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from kuikproxy.core.fleetturns import STORE_TIMEOUT
from kuikproxy.fleet.backend import StoreView

TIMEOUT = STORE_TIMEOUT  # seconds to connect, and per command: a window must not wait long

Client = redis.asyncio.Redis | RedisCluster


@dataclass(frozen=True, slots=True)
class RedisStore:
    """Where the fleet's Redis is and how to sign in to it (passwords read already): ``url``
    (``redis://`` or, for TLS, ``rediss://``; with ``cluster``, a node of a Redis Cluster), or
    the master ``sentinels`` name ``master_name`` (no ``url``; ``tls`` then turns TLS on)."""

    url: str | None = None
    cluster: bool = False
    sentinels: tuple[tuple[str, int], ...] = ()
    master_name: str | None = None
    username: str | None = None
    password: str | None = None  # a password in the URL wins
    sentinel_password: str | None = None
    tls: bool = False  # Sentinel's master and the Sentinels; a URL says it by rediss://
    tls_ca_file: str | None = None


class OpenStore:
    """A redis-py client of a :class:`RedisStore`, and what is said of it: ``where`` in error
    messages (never a password), :meth:`view` in ``/status``."""

    def __init__(self, store: RedisStore) -> None:
        self._sentinel: Sentinel | None = None
        self._pool: SentinelConnectionPool | None = None  # Sentinel's master's connections
        self.client: Client
        options = _options(store)
        if store.sentinels:
            if store.url is not None or store.cluster or store.master_name is None:
                raise ValueError("fleet: Sentinel needs a master name, and no URL or cluster")
            names = ", ".join(f"{host}:{port}" for host, port in store.sentinels)
            self.mode, self.where = "sentinel", f"master {store.master_name} of {names}"
            self._sentinel = Sentinel(
                store.sentinels, sentinel_kwargs=_sentinel_options(store), **options
            )
            master: redis.asyncio.Redis = self._sentinel.master_for(store.master_name)
            assert isinstance(master.connection_pool, SentinelConnectionPool)
            self.client, self._pool = master, master.connection_pool
        elif store.url is None:
            raise ValueError("fleet: a Redis URL, or Sentinels and a master name")
        elif store.cluster:
            self.mode = "cluster"
            self.client = RedisCluster.from_url(store.url, **options)
            seed = urlsplit(store.url)
            self.where = f"cluster of {seed.hostname}:{seed.port or 6379}"
        else:
            self.mode = "single"
            self.client = redis.asyncio.from_url(store.url, **options)
            kwargs = self.client.connection_pool.connection_kwargs  # never the URL: a password
            self.where = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"

    def view(self) -> StoreView:
        if isinstance(self.client, RedisCluster):
            return StoreView(self.mode, None, len(self.client.get_primaries()))
        if self._sentinel is not None:
            return StoreView(self.mode, self.master(), None)
        return StoreView(self.mode, self.where, None)

    def master(self) -> str | None:
        """On Sentinel, the master it named at the last connection (or :meth:`follow`)."""
        if self._pool is None or self._pool.master_address is None:
            return None
        return _address(self._pool.master_address)

    async def follow(self) -> None:
        """On Sentinel, ask it which master it is now: when it names another, the pool drops
        its connections to the old one (they are dropped as they come back), so the next call
        goes to the new master — not only once the old one refuses writes, which after a
        failover Sentinel ran while it was up can take seconds."""
        if self._pool is not None:
            await self._pool.get_master_address()  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        await self.client.aclose()
        if self._sentinel is not None:
            with contextlib.suppress(Exception):  # nothing to tell a proxy that stops
                await self._sentinel.aclose()


def _options(store: RedisStore) -> dict[str, Any]:
    options: dict[str, Any] = {
        "socket_connect_timeout": TIMEOUT,
        "socket_timeout": TIMEOUT,
        # RESP2, as redis-py before 8 spoke: any Redis (and look-alike) answers it, and a
        # missing password reads "Authentication required" rather than a HELLO error
        "protocol": 2,
        # one retry, at once, of a connection that failed (every script is idempotent): a
        # pooled connection that a restarted server closed is then replaced (and, on Sentinel,
        # the master asked again); a timeout is not retried, a window must not wait twice.
        # A cluster retries what it counts as a node failure, timeouts too, once: that retry
        # is how it learns the slots again
        "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    }
    if store.username is not None:
        options["username"] = store.username
    if store.password is not None:
        options["password"] = store.password
    scheme = (store.url or "").partition("://")[0].lower()
    if store.tls_ca_file is not None:
        if not (store.tls or scheme == "rediss"):
            raise ValueError("fleet: a TLS CA file needs a rediss:// URL (or TLS to Sentinel's)")
        options["ssl_ca_certs"] = store.tls_ca_file
    if store.tls:
        options["ssl"] = True
    return options


def _sentinel_options(store: RedisStore) -> dict[str, Any]:
    """The Sentinels' connections: the same timeouts and TLS, their own password (if any)."""
    options: dict[str, Any] = {
        "socket_connect_timeout": TIMEOUT,
        "socket_timeout": TIMEOUT,
        "protocol": 2,
    }
    if store.sentinel_password is not None:
        options["password"] = store.sentinel_password
    if store.tls:
        options["ssl"] = True
        if store.tls_ca_file is not None:
            options["ssl_ca_certs"] = store.tls_ca_file
    return options


def _address(address: tuple[Any, Any]) -> str:
    host, port = address
    host = host.decode() if isinstance(host, bytes) else str(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
