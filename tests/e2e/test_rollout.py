"""A rollout: one multi-arch image pulled by ten nodes at once ("a read
in flight is shared"). The registry is asked for the index once, for each platform manifest
some node needs once (never for one no node needs), and for each blob once.

The evidence is the real registry's own request log (distribution's, read with
``parse_registry_log``), never kuikproxy's counters. The image is an OCI index of four
platforms, two layers and a config each; the nodes pull three of them (amd64 ×4, arm64 ×3,
s390x ×3), so the fourth (ppc64le) must never be read.

The registry is far away: kuikproxy reads it through a front that starts every answer
:data:`LATENCY` after its request (a round trip to a public registry, a :class:`DistantFront`)
and sends blobs at :data:`RATE` a second (nginx's ``limit_rate``, as in test_store.py). The
latency is what makes small answers — platform manifests, configs — take long enough that the
ten nodes' requests for them overlap the first one's read: ``limit_rate`` alone sends a few
hundred bytes at once, and kuikproxy without its store always reads a copy's content again
once nobody follows the read in flight (a copy is never answered from a kept answer, R1).

* **Ten containerd daemons** (ten roots, nothing shared between them; each its own resource,
  ``Kuik-Resource: node-<n>`` from the shipped strict ``examples/containerd/hosts.toml``) run
  ``ctr images pull --platform`` at once. containerd resolves the tag with a ``HEAD`` (a check)
  and reads the index by digest (a copy): one ``HEAD`` of the tag, one ``GET`` of the index.
* **Ten plain HTTP clients** in a burst (released together by a barrier) each ``GET`` the tag
  (``Accept`` the OCI index), their platform's manifest by digest, its config and layers: one
  ``GET`` of the tag.

Both run with kuikproxy's pull-through store (``cache.blobs.path``, SPEC §15) and without it
(blobs given from memory to every client that follows the read, R2). A config is a few
hundred bytes: it arrives whole with the registry's answer, and the clients that followed its
read must be given it even though the first one may have taken it all before they look.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from tests.e2e.conftest import REGISTRY, StartProxy
from tests.e2e.peers import (
    OCI_INDEX,
    OCI_MANIFEST,
    Containerd,
    DistributionRegistry,
    Kuikproxy,
    LoggedRequest,
    RecordingForwarder,
    RegistryClient,
    Run,
    SeededImage,
    build_image,
    http,
    push_image,
)
from tests.e2e.test_store import (
    content_of,
    explain,
    require_peers,
    slow_front,
    strict_hosts,
    with_store,
)

pytestmark = pytest.mark.e2e

KiB = 1024
PULLED = {"linux/amd64": 4, "linux/arm64": 3, "linux/s390x": 3}
"""How many of the ten nodes (or clients) pull each platform."""
NODES = tuple(platform for platform, count in PULLED.items() for _ in range(count))
"""The platform node ``n`` pulls."""
UNPULLED = "linux/ppc64le"
"""In the index, pulled by nobody: the registry must never be asked for it."""
LAYERS = 2  # a platform's layers, each of LAYER_SIZE bytes that do not compress
LAYER_SIZE = 256 * KiB
LATENCY = 0.5  # seconds before the front starts any answer
RATE = "1m"  # bytes a second nginx sends each answer at: a layer takes it a quarter second


# --- the image ------------------------------------------------------------------------------


def names_of(image: SeededImage) -> dict[str, str]:
    """Every reference a read of ``image`` may name, by what it is: ``{reference: what}``."""
    named = {image.tag: "tag", image.index.digest: "index"}
    for platform in image.platforms:
        named |= platform.content
    return named


def pull_of(image: SeededImage, name: str) -> set[str]:
    """The digests a node pulling platform ``name`` of ``image`` holds afterwards."""
    return {image.index.digest, *image.platform(name).content}


def ref_of(image: SeededImage) -> str:
    return f"{REGISTRY}/{image.repository}:{image.tag}"


# --- the registry's reads -------------------------------------------------------------------


def reads_of(
    registry: DistributionRegistry, image: SeededImage, at_least: int, timeout: float = 5
) -> tuple[Counter[str], list[LoggedRequest]]:
    """The registry's reads (``GET`` and ``HEAD``) of ``image``'s repository counted by what
    they read (``"HEAD tag"``, ``"GET linux/arm64 layer 1"``...), once at least ``at_least``
    are logged (its log may trail the answer a moment); and the rows themselves."""
    deadline = time.monotonic() + timeout
    while True:
        rows = [
            r
            for r in registry.requests()
            if r.repository == image.repository and r.method in ("GET", "HEAD")
        ]
        if len(rows) >= at_least or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    names = names_of(image)
    counted = Counter(f"{r.method} {names.get(r.reference, r.reference)}" for r in rows)
    return counted, rows


def expected_reads(image: SeededImage, resolve: tuple[str, ...]) -> Counter[str]:
    """One read of each of ``resolve`` (how the tag is resolved: ``"HEAD tag"``...), and one
    ``GET`` of the manifest and of each blob of every platform some node pulls; nothing of
    the others."""
    expected = Counter(resolve)
    for name in PULLED:
        expected.update(f"GET {what}" for what in image.platform(name).content.values())
    return expected


def timeline(rows: list[LoggedRequest], image: SeededImage) -> str:
    """The registry's reads, one a line, times from the first: for assertion messages."""
    if not rows:
        return "(the registry logged no read)"
    names, t0 = names_of(image), min(r.started for r in rows)
    return "\n".join(
        f"{r.started - t0:7.3f}..{r.finished - t0:7.3f} {r.method:4} "
        f"{names.get(r.reference, r.reference)} -> {r.status}"
        for r in sorted(rows, key=lambda r: r.started)
    )


# --- the far registry -----------------------------------------------------------------------


class DistantFront(RecordingForwarder):
    """A :class:`RecordingForwarder` that starts forwarding each request ``latency`` seconds
    after it came: a registry on the other side of the world, whose every answer, however
    small, takes a while to come."""

    def __init__(self, target: str, latency: float) -> None:
        super().__init__(target)
        self.latency = latency

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        await asyncio.sleep(self.latency)
        return await super()._handle(request)


@dataclass
class Rollout:
    """A fresh image on the session's registry, and a kuikproxy reading the registry through
    the far front: checks every second, copies every two (the windows the ten nodes share)."""

    registry: DistributionRegistry
    image: SeededImage
    proxy: Kuikproxy
    store: bool
    root: Path

    def explain(self, rows: list[LoggedRequest], *runs: Run) -> str:
        return f"--- registry reads ---\n{timeline(rows, self.image)}\n" + explain(
            self.proxy, *runs
        )


@pytest.fixture(params=[True, False], ids=["store", "no-store"])
def rollout(
    request: pytest.FixtureRequest,
    registry: DistributionRegistry,
    start_proxy: StartProxy,
    tmp_path: Path,
) -> Iterator[Rollout]:
    """kuikproxy with the pull-through store (``cache.blobs.path``) or without it, before
    ``front (latency) → nginx (limit_rate) → registry``; every peer stopped at the end."""
    require_peers("nginx")
    store: bool = request.param
    image = push_image(
        RegistryClient(registry.url),
        build_image(
            f"rollout/app{time.time_ns()}",
            "v1",
            (*PULLED, UNPULLED),
            filler=LAYER_SIZE,
            layers=LAYERS,
        ),
    )
    with contextlib.ExitStack() as stack:
        nginx = stack.enter_context(slow_front(tmp_path / "nginx", registry, RATE))
        front = stack.enter_context(DistantFront(nginx.url, LATENCY))
        proxy = stack.enter_context(
            start_proxy(
                front.url,
                top=with_store(tmp_path / "store") if store else {},
                check={"interval": "1s"},
                copy={"interval": "2s"},
            )
        )
        yield Rollout(registry, image, proxy, store, tmp_path)


def report(rollout: Rollout, counted: Counter[str], took: float) -> None:
    """What the run cost, for the test's output (``-s``): the registry's reads, and kuikproxy's
    own account of them (``/status``), to compare, never to assert on."""
    status = rollout.proxy.status()
    store = status.get("cache", {}).get("store") or {}
    own = {"reads": status.get("reads"), "store": store.get("reads")}
    print(
        f"\n{len(NODES)} pulls in {took:.1f}s ({'store' if rollout.store else 'no store'}); "
        f"registry reads {dict(sorted(counted.items()))}; kuikproxy says {own}"
    )


# --- 1. ten containerd nodes ----------------------------------------------------------------


def test_ten_containerd_nodes_pulling_one_index_cost_one_read_of_each_thing_needed(
    rollout: Rollout,
) -> None:
    """Ten containerd daemons, each with a root of its own and the shipped strict hosts.toml
    naming it ``node-<n>``, run ``ctr images pull --platform`` of one tag at once. Every pull
    succeeds and each node holds exactly the index and its platform's manifest, config and
    layers, with the pushed digests. The registry's log has one ``HEAD`` of the tag (the
    nodes' resolution, a check), one ``GET`` of the index by digest (their copy), one ``GET``
    of each platform manifest a node pulls, none of ppc64le's, and one ``GET`` of each blob
    pulled: nine of the ten nodes' reads of each were given another's (R2)."""
    require_peers("containerd", "ctr")
    image, proxy = rollout.image, rollout.proxy
    with contextlib.ExitStack() as stack:
        nodes = [
            stack.enter_context(Containerd(rollout.root / f"node-{n}")) for n in range(len(NODES))
        ]
        hosts = [
            strict_hosts(rollout.root / f"node-{n}", proxy, f"node-{n}") for n in range(len(NODES))
        ]

        def pull(n: int) -> Run:
            return nodes[n].ctr(
                "--timeout", "60s", "images", "pull", "--hosts-dir", str(hosts[n]),
                "--snapshotter", "native", "--platform", NODES[n], ref_of(image),
            )  # fmt: skip

        started = time.monotonic()
        with ThreadPoolExecutor(len(NODES)) as pool:
            pulls = list(pool.map(pull, range(len(NODES))))
        took = time.monotonic() - started
        expected = expected_reads(image, ("HEAD tag", "GET index"))
        counted, rows = reads_of(rollout.registry, image, sum(expected.values()))
        for pulled in pulls:
            assert pulled.returncode == 0, rollout.explain(rows, pulled)
        for node, platform in zip(nodes, NODES, strict=True):
            listed = node.ctr("images", "ls")
            # ctr logs that it cannot size the platforms the node did not pull: not a row
            lines = [line for line in listed.output.splitlines() if not line.startswith("time=")]
            images = {row[0]: row[2] for row in map(str.split, lines[1:]) if row}
            assert images == {ref_of(image): image.index.digest}, str(listed)
            assert content_of(node) == pull_of(image, platform), platform
    # each node a resource of its own (its hosts.toml's Kuik-Resource): shared across them
    resources = set(proxy.status()["resources"])
    assert {f"node-{n}" for n in range(len(NODES))} <= resources, sorted(resources)
    report(rollout, counted, took)
    assert counted == expected, rollout.explain(rows)


# --- 2. ten HTTP clients in a burst ---------------------------------------------------------


@dataclass(frozen=True)
class Pulled:
    """What one HTTP client was given, by digest it asked for: the sha256 of each body."""

    platform: str
    bodies: dict[str, str]


def pull_over_http(
    proxy: Kuikproxy, image: SeededImage, client: int, go: threading.Barrier
) -> Pulled:
    """Client ``client`` (resource ``client-<n>``), once every client is ready: ``GET`` the tag
    as an OCI index, its platform's manifest by the digest the index names, then the config
    and layers that manifest names, all at once, the way a node pulls."""
    platform = NODES[client]
    base = f"{proxy.url}/v2/{image.repository}"
    resource = {"Kuik-Resource": f"client-{client}"}
    bodies: dict[str, str] = {}

    def get(path: str, accept: str | None = None) -> bytes:
        headers = resource | ({"Accept": accept} if accept else {})
        status, _, body = http(f"{base}/{path}?ns={REGISTRY}", headers=headers, timeout=60)
        assert status == 200, (client, path, status, body[:300])
        return body

    go.wait(10)
    index = get(f"manifests/{image.tag}", OCI_INDEX)
    bodies[image.tag] = hashlib.sha256(index).hexdigest()
    os_name, arch = platform.split("/")
    child = next(
        m["digest"]
        for m in json.loads(index)["manifests"]
        if m["platform"] == {"os": os_name, "architecture": arch}
    )
    manifest = get(f"manifests/{child}", OCI_MANIFEST)
    bodies[child] = hashlib.sha256(manifest).hexdigest()
    described = json.loads(manifest)
    digests = [blob["digest"] for blob in (described["config"], *described["layers"])]
    with ThreadPoolExecutor(len(digests)) as pool:  # all at once, as containerd fetches them
        hashes = pool.map(lambda d: hashlib.sha256(get(f"blobs/{d}")).hexdigest(), digests)
        bodies |= zip(digests, hashes, strict=True)
    return Pulled(platform, bodies)


def test_ten_http_clients_in_a_burst_cost_one_read_of_each_thing_needed(
    rollout: Rollout,
) -> None:
    """Ten plain HTTP clients, each its own resource, released within milliseconds of one
    another, each read the tag (``Accept`` the OCI index), their platform's manifest by
    digest, its config and layers. Every body hashes to the digest pushed for it; the
    registry's log has one ``GET`` of the tag, one of each platform manifest a client needs,
    none of ppc64le's, and one of each blob needed."""
    image, proxy = rollout.image, rollout.proxy
    go = threading.Barrier(len(NODES))
    started = time.monotonic()
    with ThreadPoolExecutor(len(NODES)) as pool:
        pulled = list(pool.map(lambda n: pull_over_http(proxy, image, n, go), range(len(NODES))))
    took = time.monotonic() - started
    expected = expected_reads(image, ("GET tag",))
    counted, rows = reads_of(rollout.registry, image, sum(expected.values()))

    for got in pulled:
        wanted = {image.tag: image.index.digest} | {
            d: d for d in image.platform(got.platform).content
        }
        assert {ref: f"sha256:{h}" for ref, h in got.bodies.items()} == wanted, got.platform
    report(rollout, counted, took)
    assert counted == expected, rollout.explain(rows)
