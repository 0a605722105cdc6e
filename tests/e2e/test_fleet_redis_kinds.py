"""The fleet on the Redis operators run, each with three real ``kuikproxy serve`` processes
pacing one registry host (a check window every 200 ms, work due at every window) while the
store changes under them; the registry's own log is the evidence: every request answered, no
two reads closer than the interval (less ``tests/e2e/test_fleet.py``'s tolerance), and
``/status.fleet`` says what the store is.

* **Sentinel**: a master, its replica, three Sentinels with a password of their own; the master
  is killed under load, the fleet follows the replica Sentinel promotes.
* **Redis Cluster** of three masters, reached as an ACL user with only the fleet's commands:
  the slot holding the host's keys is resharded under load to a node that lost its scripts.
* **ACL user** on one server, allowed only the commands the fleet needs (none is refused).
* **TLS** to one server, its certificate signed by a test CA.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import REGISTRY, require
from tests.e2e.peers import (
    DistributionRegistry,
    Kuikproxy,
    RedisSentinel,
    cluster_node,
    cluster_slot_owner,
    create_cluster,
    fleet_of,
    move_slot,
    redis_cli,
    wait_for,
)
from tests.e2e.test_fleet import INTERVAL, TOLERANCE, ask, reads, warm
from tests.fleet.conftest import RedisServer, TlsFiles, redis_server_factory

pytestmark = pytest.mark.e2e

__all__ = ["redis_server_factory"]  # a fixture, used by name

PER_PROXY = 20  # images each proxy's client asks for: 60 reads, 12 s of windows at least

ADMIN = ("admin", "admin-secret")
FLEET_USER = ("kuik", "kuik-secret")
FLEET_COMMANDS = (
    *("+evalsha", "+script|load"),  # the scripts, loaded again on NOSCRIPT
    *("+time", "+get", "+set", "+mget", "+del", "+exists", "+pexpire"),
    *("+hget", "+hset", "+hmget", "+zadd", "+zrange", "+zremrangebyscore", "+zcard"),
)
"""What the fleet's user needs on one server or Sentinel's master (the scripts' own calls are
checked against it too)."""
CLUSTER_COMMANDS = ("+cluster|slots", "+command")
"""And on a Redis Cluster: redis-py learns the slots, and the commands' keys, with these."""


def users(*commands: str) -> list[str]:
    """``redis-server`` options: no ``default`` user, ``admin`` for the test, the fleet's user
    on its keys with only ``commands``."""
    admin = ["--user", ADMIN[0], "on", f">{ADMIN[1]}", "~*", "&*", "+@all"]
    fleet = ["--user", FLEET_USER[0], "on", f">{FLEET_USER[1]}", "~kuikproxy:*"]
    return ["--user", "default", "off", *admin, *fleet, "resetchannels", "-@all", *commands]


def password_file(directory: Path, password: str) -> str:
    path = directory / f"password-{password}"
    path.write_text(password + "\n")
    return str(path)


def refused(port: int) -> str:
    """The ACL log of the node on ``port``: what the fleet's user was refused (empty: none)."""
    return redis_cli(port, "ACL", "LOG", user=ADMIN).strip()


def paced(
    fleet: list[Kuikproxy],
    registry: DistributionRegistry,
    during: Callable[[], None],
) -> list[float]:
    """Every proxy's client asks for :data:`PER_PROXY` images of its own at once, and
    ``during`` runs meanwhile: the registry's arrival times of those reads, once all are
    answered (the registry's own answer, 404: the tags do not exist)."""
    prefix = f"kinds-{time.time_ns()}"
    warm(fleet, prefix)
    since = time.time()
    with concurrent.futures.ThreadPoolExecutor(len(fleet) * PER_PROXY) as pool:
        answers = [
            pool.submit(ask, proxy, f"{prefix}/p{n}", f"t{i:02}")
            for n, proxy in enumerate(fleet)
            for i in range(PER_PROXY)
        ]
        during()
        statuses = [answer.result(timeout=120) for answer in answers]
    assert statuses == [404] * len(answers)
    times = [r.started for r in reads(registry, prefix, since)]
    assert len(times) == len(answers)
    return times


def assert_one_read_per_interval(times: list[float], fleet: list[Kuikproxy]) -> None:
    gaps = [b - a for a, b in itertools.pairwise(times)]
    logs = "\n".join(proxy.log() for proxy in fleet)
    assert min(gaps) >= INTERVAL - TOLERANCE, (sorted(gaps)[:5], logs)


def assert_joined(fleet: list[Kuikproxy]) -> list[dict[str, Any]]:
    """Every proxy reaches the store and counts the three: their ``/status.fleet``."""
    views = [proxy.status()["fleet"] for proxy in fleet]
    assert [(v["connected"], v["size"]) for v in views] == [(True, 3)] * 3, views
    return views


@pytest.mark.parametrize("how", ["killed", "failed-over"])
def test_sentinel_the_fleet_follows_a_failover_under_load(
    how: str,
    registry: DistributionRegistry,
    redis_server_factory: Callable[..., RedisServer],
    tmp_path: Path,
) -> None:
    """While the three proxies have work due at every window, Sentinel's master is killed
    (they pace alone until Sentinel has promoted the replica), or Sentinel is told to fail
    over while the master is up (it stays a master, one the proxies can still write to, for
    seconds after the replica is promoted): the proxies move to the new master, and say so;
    windows are lost meanwhile, and the registry never sees two reads within an interval.
    Failing over a live master takes ``confirmedBy: 1``: a claim counts once a replica holds
    it, which the master left behind has none to do (without it, proxies still on the old
    master and those on the new one read in one window: 3 runs in 5 did)."""
    require(RedisSentinel.binary)
    master = redis_server_factory()
    replica = redis_server_factory("--replicaof", "127.0.0.1", str(master.port))
    wait_for(
        "the replica in sync",
        lambda: "master_link_status:up" in redis_cli(replica.port, "INFO", "replication"),
    )
    secret = "sentinel-secret"
    with contextlib.ExitStack() as stack:
        sentinels = [
            stack.enter_context(
                RedisSentinel(tmp_path / f"sentinel-{n}", master.port, password=secret)
            )
            for n in range(3)
        ]
        for sentinel in sentinels:
            wait_for("Sentinels that know each other", lambda s=sentinel: s.sees(1, 3))
        settings = {
            "sentinels": [sentinel.host_port for sentinel in sentinels],
            "masterName": "fleet",
            "sentinelPasswordFile": password_file(tmp_path, secret),
            # killed, the master leaves the new one no replica: confirmed claims would stop
            # the fleet until it is back
            "confirmedBy": 0 if how == "killed" else 1,
        }
        promoted = f"127.0.0.1:{replica.port}"

        def failover() -> None:
            time.sleep(3.0)
            if how == "killed":
                master.stop()  # SIGKILL: whatever it had not sent its replica is lost
            else:
                sentinels[0].ask("SENTINEL", "FAILOVER", "fleet")
            wait_for("the replica promoted", lambda: sentinels[0].master() == promoted)

        with fleet_of(3, registry.url, REGISTRY, settings, tmp_path) as fleet:
            before = fleet[0].status()["fleet"]["store"]
            times = paced(fleet, registry, failover)
            after = assert_joined(fleet)
    assert before == {"mode": "sentinel", "address": f"127.0.0.1:{master.port}", "nodes": None}
    assert [view["store"]["address"] for view in after] == [promoted] * 3
    assert_one_read_per_interval(times, fleet)


def test_cluster_the_fleet_keeps_pacing_while_its_hosts_slot_is_resharded(
    registry: DistributionRegistry,
    redis_server_factory: Callable[..., RedisServer],
    tmp_path: Path,
) -> None:
    """Three masters, the fleet's user allowed only its commands. Under load, the slot of the
    registry host's keys moves to a node whose scripts were flushed: clients are sent ASK or
    TRYAGAIN while its keys move, then MOVED, and the new node answers NOSCRIPT until redis-py
    loads the scripts again. The registry never sees two reads within an interval, nothing
    was refused, and ``/status`` says cluster, three nodes."""
    nodes = [redis_server_factory(*cluster_node(), *users(*FLEET_COMMANDS, *CLUSTER_COMMANDS))
             for _ in range(3)]  # fmt: skip
    ports = [node.port for node in nodes]
    create_cluster(ports, user=ADMIN)
    slot = int(redis_cli(ports[0], "CLUSTER", "KEYSLOT", f"{{{REGISTRY}}}", user=ADMIN))
    source = cluster_slot_owner(ports, slot, ADMIN)
    target = next(port for port in ports if port != source)
    settings = {
        "url": f"redis://127.0.0.1:{ports[0]}",
        "cluster": True,
        "username": FLEET_USER[0],
        "passwordFile": password_file(tmp_path, FLEET_USER[1]),
    }
    moved: list[int] = []

    def script_loads() -> int:
        stats = redis_cli(target, "INFO", "commandstats", user=ADMIN)
        found = re.search(r"cmdstat_script\|load:calls=(\d+)", stats)
        return int(found.group(1)) if found else 0

    def reshard() -> None:
        time.sleep(3.0)
        redis_cli(target, "SCRIPT", "FLUSH", user=ADMIN)
        moved.append(script_loads())
        moved.append(move_slot(slot, source, target, ports, ADMIN))

    with fleet_of(3, registry.url, REGISTRY, settings, tmp_path) as fleet:
        times = paced(fleet, registry, reshard)
        views = assert_joined(fleet)
    loads_before, keys = moved
    assert keys > 0  # the host's origins, turns, windows, kept answers
    assert cluster_slot_owner(ports, slot, ADMIN) == target
    assert script_loads() > loads_before  # NOSCRIPT on the new node, and the scripts loaded
    cluster = {"mode": "cluster", "address": None, "nodes": 3}
    assert [view["store"] for view in views] == [cluster] * 3
    assert [refused(port) for port in ports] == [""] * 3
    assert_one_read_per_interval(times, fleet)


def test_an_acl_user_with_only_the_fleets_commands(
    registry: DistributionRegistry,
    redis_server_factory: Callable[..., RedisServer],
    tmp_path: Path,
) -> None:
    server = redis_server_factory(*users(*FLEET_COMMANDS))
    settings = {
        "url": server.url,
        "username": FLEET_USER[0],
        "passwordFile": password_file(tmp_path, FLEET_USER[1]),
    }
    with fleet_of(3, registry.url, REGISTRY, settings, tmp_path) as fleet:
        times = paced(fleet, registry, lambda: None)
        views = assert_joined(fleet)
    address = f"127.0.0.1:{server.port}"
    assert views[0]["store"] == {"mode": "single", "address": address, "nodes": None}
    assert refused(server.port) == ""
    assert_one_read_per_interval(times, fleet)


def test_tls_to_a_server_signed_by_the_fleets_ca(
    registry: DistributionRegistry,
    redis_server_factory: Callable[..., RedisServer],
    tmp_path: Path,
) -> None:
    files = TlsFiles.issued(tmp_path)
    server = redis_server_factory(tls=files)
    settings = {"url": server.url, "tlsCaFile": str(files.ca)}
    assert server.url.startswith("rediss://")
    with fleet_of(3, registry.url, REGISTRY, settings, tmp_path) as fleet:
        times = paced(fleet, registry, lambda: None)
        assert_joined(fleet)
    assert_one_read_per_interval(times, fleet)
