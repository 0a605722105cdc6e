"""The fleet on Redis: :class:`RedisFleet` implements :class:`FleetBackend`.

Key layout, with the default ``key_prefix`` ``kuikproxy:``, ``<series>`` ``check`` or ``copy``,
``<host>`` the registry host as configured (``{…}`` literal braces, a Redis hash tag)::

    kuikproxy:fleet                         sorted set  proxy name -> its last heartbeat (ms,
                                                        Redis' clock); older than 60 s: dropped
    kuikproxy:{<host>}:<series>:origin      hash        interval (whole ms), origin (wall time,
                                                        seconds); never expires
    kuikproxy:{<host>}:<series>:due         sorted set  proxy name -> its last claim (ms, Redis'
                                                        clock); expires 2 intervals + 1 s after
                                                        the last claim
    kuikproxy:{<host>}:<series>:window:<k>  string      the name of the proxy that got window k;
                                                        expires 2 intervals + 1 s after
    kuikproxy:{<host>}:<series>:forming     string      set when the store had lost the origin
                                                        (it restarted empty) and a proxy that
                                                        had it is back; expires 2 intervals
                                                        + 1 s after
    kuikproxy:{<host>}:block                string      the block's end (wall time, seconds);
                                                        expires at that end
    kuikproxy:{<host>}:kept:<key>           string      a kept answer (R1), as the runtime
                                                        serialised it; expires after cache.maxAge
    kuikproxy:{<host>}:reading:<key>        string      the name of the proxy reading content by
                                                        digest for the fleet; expires after
                                                        the read's timeout, or deleted by its
                                                        reader when its answer is kept
    kuikproxy:{<host>}:bucket:<key>         hash        a shared quota bucket: level, at (ms,
                                                        Redis' clock); expires once it is full

Another ``key_prefix`` keeps several fleets apart on one Redis. Every read-modify-write is one
Lua script, so it is atomic: two proxies can never both take a window, and a block is never
shortened. The Redis is one server (or a replicated primary), Sentinel's master, or a Redis
Cluster (:mod:`.redisstore`). Every script's keys are one host's, hash-tagged ``{<host>}`` so
that they share a slot, with one exception: on one server (and Sentinel's master) the origin
and claim scripts also take ``kuikproxy:fleet`` as their last key, so that the heartbeat rides
along every claim (one round trip). On a Redis Cluster that key is in a slot of its own and is
left out: the heartbeat is then the size's call alone (at least every 10 s, well inside the
60 s a proxy counts), and a claim is still one round trip, to the node serving the host's slot.
The key names are the same everywhere (proxies of two versions share a fleet).

On Sentinel the master is asked for every second, and a call that reached another master than
the last one (a failover) is reported as the store lost, so the runtime is careful for a while;
with ``confirmedBy`` a claim counts once that many replicas hold it (``WAIT``). Every error
reaching Redis (refused, timed out, authentication, a script error, no node of a cluster) is
raised as :class:`FleetUnavailable`; timeouts are short (1 s) and only a broken connection is
retried (once, at once; a cluster retries a timeout too, to learn its slots again): a window
must not wait for the store, and the runtime's answer to it, waiting, loses windows only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisClusterException, RedisError

from kuikproxy.core.fleetturns import LATE, Claim
from kuikproxy.core.quota import SharedBucket
from kuikproxy.fleet.backend import FleetBackend, FleetUnavailable, StoreView
from kuikproxy.fleet.redisstore import TIMEOUT, OpenStore, RedisStore

log = logging.getLogger(__name__)

HEARTBEAT_EVERY = 10.0  # seconds between heartbeats when the runtime calls nothing
FOLLOW_EVERY = 1.0  # seconds between questions to Sentinel: which master is it now?
ALIVE_FOR = 60  # seconds a proxy counts in the fleet's size after its last heartbeat


def _now_and_heartbeat(fleet: int) -> str:
    """Lua that starts a script: ``now`` from Redis' clock, and, when ``KEYS[fleet]`` is given
    (the fleet's sorted set), this proxy's heartbeat in it (``ARGV[1]`` its name). Redis'
    clock, not the callers': who was seen when is compared across proxies, and their clocks
    may disagree. On a Redis Cluster that key is left out (it is in a slot of its own, and a
    script's keys must share one): the heartbeat is then :meth:`RedisFleet.size`'s alone."""
    return f"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if KEYS[{fleet}] then
  redis.call('ZADD', KEYS[{fleet}], now, ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[{fleet}], '-inf', '(' .. (now - {ALIVE_FOR * 1000}))
end
"""


# KEYS: origin, forming[, fleet]. ARGV: name, interval (ms), proposed origin, '1' if this proxy
# had the fleet's origin before (else ''). Numbers travel as strings both ways (a Lua number
# returned to Redis is cut to an integer).
_ORIGIN = (
    _now_and_heartbeat(3)
    + """
local interval = redis.call('HGET', KEYS[1], 'interval')
if interval == ARGV[2] then
  return redis.call('HGET', KEYS[1], 'origin')
end
if not interval and ARGV[4] == '1' then
  -- the store lost it (restarted empty) and a proxy of the fleet is back: turns forming
  redis.call('SET', KEYS[2], '1', 'PX', 2 * tonumber(ARGV[2]) + TIMEOUT_MS)
end
redis.call('HSET', KEYS[1], 'interval', ARGV[2], 'origin', ARGV[3])
return ARGV[3]
"""
).replace("TIMEOUT_MS", str(round(TIMEOUT * 1000)))

# KEYS: origin, due, window k, forming[, fleet]. ARGV: name, interval (ms), the origin this
# proxy uses ('' if it never asked), k. Returns {won, place, of, forming} (core.fleetturns.Claim).
_CLAIM = (
    _now_and_heartbeat(5)
    + """
local span = 2 * tonumber(ARGV[2])
if ARGV[3] ~= '' then
  local interval = redis.call('HGET', KEYS[1], 'interval')
  if not interval then
    -- the store lost it (restarted empty): put back the one the fleet used, so that a proxy
    -- joining now gets the same grid instead of starting one of its own; the turns are
    -- forming again, and proxies may still pace alone on theirs
    redis.call('HSET', KEYS[1], 'interval', ARGV[2], 'origin', ARGV[3])
    redis.call('SET', KEYS[4], '1', 'PX', span + TIMEOUT_MS)
  elseif interval ~= ARGV[2] or redis.call('HGET', KEYS[1], 'origin') ~= ARGV[3] then
    -- this proxy's grid is not the fleet's (its config has another interval, or another
    -- proxy set the origin since): its windows fall between the fleet's, none may be used
    return {0, 0, 0, 0}
  end
end
local forming = redis.call('EXISTS', KEYS[4])
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (now - span))
redis.call('PEXPIRE', KEYS[2], span + 1000)
-- turns: window k to the (k mod n)-th by name of the proxies due within two intervals
local due = redis.call('ZRANGE', KEYS[2], 0, -1)
table.sort(due)
local place = 0
for i, name in ipairs(due) do
  if name == ARGV[1] then
    place = i - 1
  end
end
local owner = redis.call('GET', KEYS[3])
if not owner and tonumber(ARGV[4]) % #due == place then
  redis.call('SET', KEYS[3], ARGV[1], 'PX', span + 1000)
  owner = ARGV[1]
end
return {owner == ARGV[1] and 1 or 0, place, #due, forming}
"""
).replace("TIMEOUT_MS", str(round(TIMEOUT * 1000)))

# KEYS: fleet. ARGV: name. The proxies seen within ALIVE_FOR, this one included.
_SIZE = _now_and_heartbeat(1) + "return redis.call('ZCARD', KEYS[1])"

# KEYS: block. ARGV: until (wall seconds), until (ms, rounded up). A block is never shortened;
# Redis expires it at its end (by Redis' clock: a skew between it and the proxies' clocks
# moves a block's end by that skew, as it moves the windows).
_BLOCK = """
local current = redis.call('GET', KEYS[1])
if current and tonumber(current) >= tonumber(ARGV[1]) then
  return current
end
redis.call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[2])
return ARGV[1]
"""


# Token buckets shared by the fleet (SPEC §11 across proxies): KEYS the buckets, ARGV pairs of
# (tokens per second, burst). All or none: every bucket must hold a token, else none is taken
# and the wait until all would is returned (seconds, as a string: Lua numbers are truncated to
# integers on the way out). Redis' clock refills them. A bucket is a hash (level, at ms) kept
# until it would be full again.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local levels = {}
local wait = 0
for i, key in ipairs(KEYS) do
  local rate = tonumber(ARGV[2 * i - 1])
  local burst = tonumber(ARGV[2 * i])
  local saved = redis.call('HMGET', key, 'level', 'at')
  local level = burst
  if saved[1] then
    local elapsed = math.max(0, now - tonumber(saved[2]))
    level = math.min(burst, tonumber(saved[1]) + elapsed * rate / 1000)
  end
  levels[i] = level
  if level < 1 then
    wait = math.max(wait, (1 - level) / rate)
  end
end
if wait > 0 then
  return tostring(wait)
end
for i, key in ipairs(KEYS) do
  local rate = tonumber(ARGV[2 * i - 1])
  local burst = tonumber(ARGV[2 * i])
  redis.call('HSET', key, 'level', tostring(levels[i] - 1), 'at', now)
  redis.call('PEXPIRE', key, math.ceil((burst - levels[i] + 1) / rate * 1000) + 1000)
end
return '0'
"""


def _ms(interval: float) -> str:
    """An interval as the fleet compares it: whole milliseconds, the same text for every
    proxy (``10.0`` and ``10`` are one interval)."""
    return str(max(1, round(interval * 1000)))


# Content by digest read once for the fleet. KEYS: the kept answer, the reading mark. ARGV:
# name, the mark's expiry (ms). Returns the kept answer, or 1 (marked: this proxy reads it), or
# 0 (another proxy is reading it).
_READING = """
local kept = redis.call('GET', KEYS[1])
if kept then
  return kept
end
local reader = redis.call('GET', KEYS[2])
if reader then
  return reader == ARGV[1] and 1 or 0
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 1
"""

# KEYS: the kept answer, the reading mark. ARGV: name, the answer ('' for none), its expiry
# (ms). The mark goes only if it is this proxy's (a late reader never unmarks another).
_READ = """
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
return 0
"""


# KEYS: any key of the host's (so that a cluster asks the node of its slot). Redis' clock.
_TIME = "return redis.call('TIME')"


class RedisFleet:
    """A :class:`FleetBackend` on Redis (:mod:`.redisstore`). Make one with :meth:`connect`."""

    def __init__(self, store: OpenStore, name: str, key_prefix: str) -> None:
        self.name = name
        self._store = store
        self._redis = client = store.client
        self._where = store.where
        self._prefix = key_prefix
        # the heartbeat rides along every origin and claim, but on a cluster (another slot)
        self._fleet_keys = [] if store.mode == "cluster" else [f"{key_prefix}fleet"]
        self._fleet_key = f"{key_prefix}fleet"
        self._origin = client.register_script(_ORIGIN)
        self._claim = client.register_script(_CLAIM)
        self._size = client.register_script(_SIZE)
        self._block = client.register_script(_BLOCK)
        self._take = client.register_script(_TAKE)
        self._reading = client.register_script(_READING)
        self._read = client.register_script(_READ)
        self._time = client.register_script(_TIME)
        # the origin this proxy was given per (host, series), checked by every claim
        self._origins: dict[tuple[str, str], str] = {}
        self._confirmed_by = 0  # replicas that must hold a claim (fleet.redis.confirmedBy)
        self._heartbeat: asyncio.Task[None] | None = None
        self._master = store.master()  # on Sentinel, the master the last call went to

    @classmethod
    async def connect(
        cls, store: RedisStore, name: str, *, key_prefix: str = "kuikproxy:", confirmed_by: int = 0
    ) -> RedisFleet:
        """A fleet on ``store``'s Redis, this proxy as ``name``. Returns even when Redis cannot
        be reached yet: the calls then raise :class:`FleetUnavailable` until it can, so a proxy
        starts alone and joins when the store answers. A malformed URL or option is a
        ``ValueError``."""
        fleet = cls(OpenStore(store), name, key_prefix)
        fleet._confirmed_by = confirmed_by
        try:
            await fleet.size()  # the first heartbeat: this proxy counts from now
            # the scripts loaded now (on a cluster, on every primary), so that the first claim
            # of a window is one round trip (not a refusal, a load and a retry: a late first
            # read of the fleet's). A node that lacks one later (a new one, or one restarted
            # after a reshard) answers NOSCRIPT, and redis-py's Script loads it again
            await fleet._call("scripts", fleet._load())
        except FleetUnavailable as error:
            log.warning("%s; pacing alone until it answers", error)
        fleet._heartbeat = asyncio.create_task(fleet._beat(), name=f"fleet heartbeat {name}")
        return fleet

    async def _load(self) -> None:
        for script in (
            self._origin, self._claim, self._block, self._take, self._reading, self._read,
            self._time,
        ):  # fmt: skip
            await self._redis.script_load(script.script)

    def _key(self, host: str, *parts: str) -> str:
        return ":".join((f"{self._prefix}{{{host}}}", *parts))

    async def _call(self, what: str, call: Awaitable[Any]) -> Any:
        try:
            answer = await call
        # a cluster client's own errors (no node reachable, say) are not RedisErrors
        except (RedisError, RedisClusterException, OSError) as error:
            detail = str(error) or type(error).__name__
            raise FleetUnavailable(
                f"fleet store {self._where} unavailable ({what}): {detail}"
            ) from error
        master, self._master = self._master, self._store.master()
        if master is not None and self._master != master:
            # Sentinel named another master (a failover) and this call went there: it is
            # reported as the store lost, so that the runtime is careful while the fleet's
            # proxies move over one by one (each alone on its turns, or back carefully: none
            # follows turns that only the proxies already moved are in); a window is lost
            raise FleetUnavailable(
                f"fleet store {self._where}: the master is now {self._master} ({what})"
            )
        return answer

    async def origin(self, host: str, series: str, interval: float, proposed: float) -> float:
        answer = await self._call(
            f"origin of {host} {series}",
            self._origin(
                keys=[
                    self._key(host, series, "origin"),
                    self._key(host, series, "forming"),
                    *self._fleet_keys,
                ],
                args=[
                    self.name,
                    _ms(interval),
                    repr(float(proposed)),
                    "1" if (host, series) in self._origins else "",
                ],
            ),
        )
        text = answer.decode() if isinstance(answer, bytes) else str(answer)
        self._origins[host, series] = text
        return float(text)

    async def time(self, host: str) -> float:
        seconds, micros = await self._call(
            f"time of {host}", self._time(keys=[self._key(host, "time")], args=[])
        )
        return int(seconds) + int(micros) / 1e6

    async def claim(self, host: str, series: str, window: int, interval: float) -> Claim:
        keys = [
            self._key(host, series, "origin"),
            self._key(host, series, "due"),
            self._key(host, series, "window", str(window)),
            self._key(host, series, "forming"),
            *self._fleet_keys,
        ]
        args: list[str | int] = [
            self.name, _ms(interval), self._origins.get((host, series), ""), window
        ]  # fmt: skip
        what = f"claim of {host} {series} window {window}"
        if not self._confirmed_by:
            won, place, of, forming = await self._call(what, self._claim(keys=keys, args=args))
            return Claim(bool(won), int(place), int(of), bool(forming))
        # WAIT counts the replicas holding this connection's writes: one pipeline, so the
        # claim and its WAIT share a connection; given up on past the window's lateness
        async with self._redis.pipeline(transaction=False) as pipe:
            await self._claim(keys=keys, args=args, client=pipe)  # type: ignore[arg-type]
            pipe.wait(self._confirmed_by, max(1, math.floor(LATE * interval * 1000)))
            (won, place, of, forming), held = await self._call(what, pipe.execute())
        # a claim no replica holds may be one a failover left behind on an old master
        return Claim(
            bool(won) and int(held) >= self._confirmed_by, int(place), int(of), bool(forming)
        )

    async def block(self, host: str, until: float) -> float:
        answer = await self._call(
            f"block of {host}",
            self._block(
                keys=[self._key(host, "block")],
                args=[repr(float(until)), math.ceil(until * 1000)],
            ),
        )
        return float(answer)

    async def blocked_until(self, host: str) -> float | None:
        """Redis drops a block at its end (its clock); a block that has ended by this proxy's
        clock is not returned either."""
        answer = await self._call(f"block of {host}", self._redis.get(self._key(host, "block")))
        if answer is None:
            return None
        until = float(answer)
        return until if until > time.time() else None

    async def keep(self, host: str, key: str, answer: bytes, ttl: float) -> None:
        expiry = max(1, math.ceil(ttl * 1000))
        await self._call(
            f"kept answer of {host}",
            self._redis.set(self._key(host, "kept", key), answer, px=expiry),
        )

    async def kept(self, host: str, keys: list[str]) -> list[bytes | None]:
        names = [self._key(host, "kept", key) for key in keys]
        found: list[bytes | None] = await self._call(
            f"kept answers of {host}", self._redis.mget(names)
        )
        return found

    async def reading(self, host: str, key: str, ttl: float) -> bytes | bool:
        answer = await self._call(
            f"read of {host} in flight",
            self._reading(
                keys=[self._key(host, "kept", key), self._key(host, "reading", key)],
                args=[self.name, max(1, math.ceil(ttl * 1000))],
            ),
        )
        return answer if isinstance(answer, bytes) else bool(answer)

    async def read(self, host: str, key: str, answer: bytes | None, ttl: float) -> None:
        await self._call(
            f"read of {host} landed",
            self._read(
                keys=[self._key(host, "kept", key), self._key(host, "reading", key)],
                args=[self.name, answer or b"", max(1, math.ceil(ttl * 1000))],
            ),
        )

    async def take(self, host: str, buckets: list[SharedBucket]) -> float:
        if not buckets:
            return 0.0
        args: list[str] = []
        for bucket in buckets:
            args += [repr(bucket.rate), repr(bucket.burst)]
        answer = await self._call(
            f"quota of {host}",
            self._take(keys=[self._key(host, "bucket", b.key) for b in buckets], args=args),
        )
        return float(answer)

    async def size(self) -> int:
        count = await self._call("fleet size", self._size(keys=[self._fleet_key], args=[self.name]))
        return max(1, int(count))

    async def _beat(self) -> None:
        """Keep this proxy counted while the runtime calls nothing (no host has work due), and
        on Sentinel ask every :data:`FOLLOW_EVERY` which master it is."""
        every = FOLLOW_EVERY if self._store.mode == "sentinel" else HEARTBEAT_EVERY
        beat = 0.0
        while True:
            await asyncio.sleep(every)
            beat += every
            with contextlib.suppress(RedisError):  # the runtime's calls report it
                await self._store.follow()
            if beat >= HEARTBEAT_EVERY:
                beat = 0.0
                with contextlib.suppress(FleetUnavailable):
                    await self.size()

    def store(self) -> StoreView:
        return self._store.view()

    async def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None
        await self._store.close()


if TYPE_CHECKING:

    def _is_a_backend(fleet: RedisFleet) -> FleetBackend:
        return fleet  # mypy checks that RedisFleet matches the seam
