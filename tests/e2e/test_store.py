"""The pull-through store with real peers (SPEC §15). The distribution registry's own request
log is the evidence; the clients are containerd daemons of their own (``ctr``), configured with
the strict ``examples/containerd/hosts.toml``.

* **One read per blob, whoever asks.** Ten containerd daemons — ten nodes, each a resource of its
  own — fetch one image of three 4 MiB layers at once; kuikproxy reads the registry through a
  slow front (nginx, ``limit_rate``) so that their reads overlap. The registry is asked for
  each blob once.
* **serveStale.** An image pulled once is pulled by tag again, by a fresh containerd, while the
  registry is down, while the registry has told kuikproxy to stop (429 with an hour's
  ``Retry-After``), and while kuikproxy is cut off from its fleet's Redis (and waits for it):
  all succeed, from the store, and the registry hears nothing.
* **Crash and bounds.** kuikproxy SIGKILLed in the middle of a blob leaves nothing that is ever
  served: restarted on the same store, it reads the blob again; a flood of distinct blobs never
  takes the store's directory past ``maxBytes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import aiohttp
import pytest
from aiohttp import web

from tests.e2e.conftest import REGISTRY, StartProxy, require, workdir
from tests.e2e.peers import (
    OCI_CONFIG,
    OCI_LAYER,
    OCI_MANIFEST,
    Blob,
    Containerd,
    DistributionRegistry,
    Kuikproxy,
    LoggedRequest,
    Nginx,
    RecordingForwarder,
    RegistryClient,
    Run,
    http,
    registry_block,
    render_example,
    run,
)
from tests.fleet.conftest import RedisServer

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024
NODES = 10


# --- images of several layers ---------------------------------------------------------------


@dataclass(frozen=True)
class LayeredImage:
    """One OCI manifest (linux/amd64), its config and its layers, pushed to ``repository:tag``."""

    repository: str
    tag: str
    manifest: Blob
    config: Blob
    layers: tuple[Blob, ...]

    @property
    def blobs(self) -> tuple[Blob, ...]:
        return (self.config, *self.layers)

    @property
    def digests(self) -> set[str]:
        return {self.manifest.digest} | {b.digest for b in self.blobs}

    @property
    def ref(self) -> str:
        return f"{REGISTRY}/{self.repository}:{self.tag}"


def random_layer(size: int) -> tuple[Blob, str]:
    """A gzipped tar of one file of ``size`` random bytes (they do not compress: the layer is a
    little over ``size`` bytes), and its diff id."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("data.bin")
        info.size, info.mode, info.mtime = size, 0o644, 0
        tar.addfile(info, io.BytesIO(os.urandom(size)))
    raw = buffer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(raw).hexdigest()
    return Blob(OCI_LAYER, gzip.compress(raw, compresslevel=1, mtime=0)), diff_id


def push_layered(
    registry: DistributionRegistry, repository: str, layers: int, size: int
) -> LayeredImage:
    """An image of ``layers`` random layers of about ``size`` bytes, pushed as ``:v1``."""
    built = [random_layer(size) for _ in range(layers)]
    config = Blob(
        OCI_CONFIG,
        json.dumps(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {"Cmd": ["/bin/true"]},
                "rootfs": {"type": "layers", "diff_ids": [diff_id for _, diff_id in built]},
            }
        ).encode(),
    )
    manifest = Blob(
        OCI_MANIFEST,
        json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": config.descriptor(),
                "layers": [layer.descriptor() for layer, _ in built],
            }
        ).encode(),
    )
    image = LayeredImage(repository, "v1", manifest, config, tuple(layer for layer, _ in built))
    client = RegistryClient(registry.url)
    for blob in image.blobs:
        client.push_blob(repository, blob)
    client.push_manifest(repository, image.tag, manifest)
    return image


def push_blobs(registry: DistributionRegistry, repository: str, blobs: list[Blob]) -> None:
    """``blobs`` in ``repository``, and a manifest ``:v1`` naming them all as layers (a pull of
    it opens a copy that their reads then belong to, §4.3)."""
    config = Blob(OCI_CONFIG, b"{}")
    client = RegistryClient(registry.url)
    for blob in (config, *blobs):
        client.push_blob(repository, blob)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config.descriptor(),
        "layers": [blob.descriptor() for blob in blobs],
    }
    client.push_manifest(repository, "v1", Blob(OCI_MANIFEST, json.dumps(manifest).encode()))


# --- peers ----------------------------------------------------------------------------------


def require_peers(*binaries: str) -> None:
    require(DistributionRegistry.binary)
    for binary in binaries:
        if binary == "nginx":
            if shutil.which(Nginx.binary) is None:
                pytest.skip("nginx is not installed (apt-get install nginx-light)")
        else:
            require(binary)


def slow_front(root: Path, registry: DistributionRegistry, rate: str) -> Nginx:
    """nginx before the registry, sending each answer at ``rate`` a second (``limit_rate``):
    it reads the registry at full speed, so the registry's log shows when a read was asked."""
    return Nginx(
        root,
        server=f"        location / {{\n            proxy_pass {registry.url};\n"
        f"            limit_rate {rate};\n        }}",
    )


def strict_hosts(root: Path, proxy: Kuikproxy, resource: str | None = None) -> Path:
    """``examples/containerd/hosts.toml`` as shipped (strict: kuikproxy is ``server`` and the
    one ``[host]``), installed for ``REGISTRY`` under ``root``; its optional ``Kuik-Resource``
    header set to ``resource``. The hosts directory."""
    header = {}
    if resource is not None:
        header = {
            '# [host."http://127.0.0.1:7439".header]': '[host."http://127.0.0.1:7439".header]',
            '#   Kuik-Resource = ["node/worker-1"]': f'  Kuik-Resource = ["{resource}"]',
        }
    text = render_example("containerd/hosts.toml", proxy.host_port, REGISTRY, **header)
    assert resource is None or f'Kuik-Resource = ["{resource}"]' in text, "hosts.toml changed"
    certs = workdir(root, "certs.d")
    workdir(certs, REGISTRY).joinpath("hosts.toml").write_text(text)
    return certs


def ctr(containerd: Containerd, *args: str) -> Run:
    return run(["ctr", "--address", str(containerd.socket), "--namespace", "e2e", *args], 90)


def fetch(containerd: Containerd, certs: Path, ref: str) -> Run:
    """``ctr content fetch``: resolve ``ref`` and read every blob of it (linux/amd64)."""
    return ctr(
        containerd, "--timeout", "60s", "content", "fetch", "--hosts-dir", str(certs),
        "--platform", "linux/amd64", ref,
    )  # fmt: skip


def pull(containerd: Containerd, certs: Path, ref: str) -> Run:
    """``ctr images pull``, as a node pulls (resolve by tag, fetch, unpack)."""
    return ctr(
        containerd, "--timeout", "60s", "images", "pull", "--hosts-dir", str(certs),
        "--snapshotter", "native", "--platform", "linux/amd64", ref,
    )  # fmt: skip


def content_of(containerd: Containerd) -> set[str]:
    """The digests of the content containerd holds."""
    listed = ctr(containerd, "content", "ls", "--quiet")
    assert listed.returncode == 0, listed
    return set(listed.output.split())


@pytest.fixture
def stack() -> Iterator[contextlib.ExitStack]:
    """Peers stopped when the test ends, passed or not, in reverse order."""
    with contextlib.ExitStack() as cleanups:
        yield cleanups


def with_store(path: Path, max_bytes: str = "1Gi", **cache: Any) -> dict[str, Any]:
    """kuikproxy's ``cache`` with the store in ``path`` (merged into the top of its config)."""
    return {"cache": {**cache, "blobs": {"path": str(path), "maxBytes": max_bytes}}}


def blob_gets(registry: DistributionRegistry, digest: str) -> list[LoggedRequest]:
    """The registry's GETs of blob ``digest``."""
    return [
        r
        for r in registry.requests()
        if r.kind == "blobs" and r.method == "GET" and r.reference == digest
    ]


def explain(proxy: Kuikproxy, *runs: Run) -> str:
    return "\n".join(str(r) for r in runs) + f"\n--- kuikproxy log ---\n{proxy.log()}"


def store_of(proxy: Kuikproxy) -> dict[str, Any]:
    store: dict[str, Any] = proxy.status()["cache"]["store"]
    return store


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.02)
    return found


# --- 1. one read per blob, whoever asks -----------------------------------------------------


def test_ten_nodes_pulling_at_once_cost_the_registry_one_read_per_blob(
    registry: DistributionRegistry,
    start_proxy: StartProxy,
    tmp_path: Path,
    stack: contextlib.ExitStack,
) -> None:
    """Ten containerd daemons of their own (ten roots: nothing shared between them), each a
    resource of its own (``Kuik-Resource: node/<n>``), fetch one image of three 4 MiB layers at
    once through the strict mirror, the store on. kuikproxy reads the registry through a front
    sending 4 MiB/s, so a layer takes it about a second and the ten clients' reads overlap.
    Each client ends up with every digest of the image; the registry's log has exactly one GET
    of each blob; kuikproxy gave the other nine of each from the read under way ("shared") or
    from the disk ("store")."""
    require_peers("containerd", "ctr", "nginx")
    image = push_layered(registry, f"store/ten{time.time_ns()}", layers=3, size=4 * MiB)
    front = stack.enter_context(slow_front(tmp_path / "nginx", registry, "4m"))
    proxy = stack.enter_context(start_proxy(front.url, top=with_store(tmp_path / "store")))
    nodes = [stack.enter_context(Containerd(tmp_path / f"node-{n}")) for n in range(NODES)]
    hosts = [strict_hosts(tmp_path / f"node-{n}", proxy, f"node/{n}") for n in range(NODES)]

    started = time.monotonic()
    with ThreadPoolExecutor(NODES) as pool:
        runs = list(pool.map(lambda n: fetch(nodes[n], hosts[n], image.ref), range(NODES)))
    took = time.monotonic() - started
    for fetched in runs:
        assert fetched.returncode == 0, explain(proxy, fetched)
    for node in nodes:
        assert content_of(node) == image.digests

    gets = {b.digest: len(blob_gets(registry, b.digest)) for b in image.blobs}
    store = store_of(proxy)
    print(f"\n{NODES} nodes fetched in {took:.1f}s; registry GETs per blob {list(gets.values())}")
    print(f"store: {store}")
    assert gets == dict.fromkeys(gets, 1), explain(proxy)
    blob_bytes = sum(len(b.data) for b in image.blobs)
    assert store["reads"]["registry"] == len(image.blobs), store
    assert store["reads"]["shared"] + store["reads"]["store"] >= (NODES - 1) * len(image.blobs)
    assert store["reads"]["shared"] > 0, store  # some clients followed a read under way
    assert sum(store["servedBytes"].values()) >= NODES * blob_bytes, store
    assert store["servedBytes"]["registry"] == blob_bytes, store


# --- 2. serveStale --------------------------------------------------------------------------


@dataclass
class PulledOnce:
    """A registry of its own, kuikproxy before it (directly or through ``front``) with the store
    and ``serveStale: true``, and an image pulled through it once by a containerd since gone."""

    registry: DistributionRegistry
    proxy: Kuikproxy
    image: LayeredImage
    front: RecordingForwarder | None


MAX_AGE = 0.5  # seconds: kept answers older than this must be asked again (R1)


def pulled_once(
    root: Path,
    start_proxy: StartProxy,
    stack: contextlib.ExitStack,
    *,
    front: bool,
    top: dict[str, Any] | None = None,
) -> PulledOnce:
    registry = stack.enter_context(DistributionRegistry(root / "registry"))
    image = push_layered(registry, "stale/app", layers=3, size=512 * 1024)
    forwarder = stack.enter_context(RecordingForwarder(registry.url)) if front else None
    proxy = stack.enter_context(
        start_proxy(
            forwarder.url if forwarder is not None else registry.url,
            top=with_store(root / "store", maxAge=f"{int(MAX_AGE * 1000)}ms") | (top or {}),
            check={"maxHold": "300ms"},
            serveStale=True,
        )
    )
    with Containerd(root / "first") as first:
        pulled = pull(first, strict_hosts(root / "first", proxy), image.ref)
        assert pulled.returncode == 0, explain(proxy, pulled)
        assert content_of(first) == image.digests
    for blob in image.blobs:
        assert len(blob_gets(registry, blob.digest)) == 1
    time.sleep(MAX_AGE + 0.1)  # what kuikproxy keeps in memory is too old now: only the store
    return PulledOnce(registry, proxy, image, forwarder)


def pull_afresh(root: Path, once: PulledOnce) -> Run:
    """A fresh containerd (a root of its own: nothing cached) pulls the image by tag."""
    with Containerd(root / "fresh") as fresh:
        pulled = pull(fresh, strict_hosts(root / "fresh", once.proxy), once.image.ref)
        assert pulled.returncode == 0, explain(once.proxy, pulled)
        assert content_of(fresh) == once.image.digests
        return pulled


def test_a_node_pulls_an_image_seen_before_while_the_registry_is_down(
    start_proxy: StartProxy, tmp_path: Path, stack: contextlib.ExitStack
) -> None:
    """Pulled once; the registry's process is stopped (kuikproxy's connections are refused). A
    fresh containerd pulls the same tag: its ``HEAD`` (a check, §4.3) is answered from the
    store's mapping of the tag, stale, and the manifest and blobs come from the disk."""
    require_peers("containerd", "ctr")
    once = pulled_once(tmp_path, start_proxy, stack, front=False)
    asked = len(once.registry.requests())
    once.registry.stop()

    pulled = pull_afresh(tmp_path, once)
    store = store_of(once.proxy)
    print(f"\npulled with the registry down in {pulled.seconds:.1f}s; store {store}")
    assert store["stale"] >= 1, store
    assert store["reads"]["registry"] == len(once.image.blobs), store  # none since
    assert len(once.registry.requests()) == asked


def test_a_node_pulls_an_image_seen_before_while_the_registry_says_stop(
    start_proxy: StartProxy, tmp_path: Path, stack: contextlib.ExitStack
) -> None:
    """Pulled once; then the registry answers kuikproxy 429 with ``Retry-After: 3600`` (a front
    that refuses every request), and one read (of a tag never pulled) blocks the host for an
    hour. A fresh containerd pulls the same tag: it succeeds from the store, and neither the
    front nor the registry hears of it. A check of kuik's (``Kuik-Resource``) is not answered
    stale (``serveStale: true``, not ``checks``): held past ``check.maxHold``, it is refused."""
    require_peers("containerd", "ctr")
    once = pulled_once(tmp_path, start_proxy, stack, front=True)
    assert once.front is not None
    proxy, repository = once.proxy, once.image.repository
    once.front.refuse = (429, {"Retry-After": "3600"})
    probe = http(f"{proxy.url}/v2/{repository}/manifests/never?ns={REGISTRY}", "HEAD")
    assert probe[0] == 429, probe
    wait_for(lambda: proxy.status()["registries"][REGISTRY]["blockedUntil"], 5, "the host blocked")
    _, contacts = once.front.snapshot()
    asked = len(once.registry.requests())

    pulled = pull_afresh(tmp_path, once)
    check = http(
        f"{proxy.url}/v2/{repository}/manifests/v1?ns={REGISTRY}",
        "HEAD",
        headers={"Kuik-Resource": "ImageMonitor/default/app"},
    )
    store = store_of(proxy)
    print(f"\npulled while blocked in {pulled.seconds:.1f}s; store {store}")
    assert once.front.snapshot()[1] == contacts
    assert len(once.registry.requests()) == asked
    assert store["stale"] >= 1, store
    assert check[0] == 429, check


def test_a_node_pulls_an_image_seen_before_while_its_proxy_is_cut_off_from_the_fleet(
    start_proxy: StartProxy, tmp_path: Path, stack: contextlib.ExitStack
) -> None:
    """A proxy of a fleet (``whenCutOff: wait``, the default) pulled the image once; then its
    Redis is killed, and it uses no window until Redis is back. A fresh containerd pulls the
    same tag: its ``HEAD`` waits for the window the proxy cannot claim and is answered stale
    then, the rest comes from the disk, and the registry hears nothing. A tag never pulled
    waits for the fleet, until ``check.maxHold`` refuses it."""
    require_peers("containerd", "ctr", "redis-server")
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    stack.callback(redis.stop)
    fleet = {"fleet": {"redis": {"url": redis.url}, "name": "p0"}}
    once = pulled_once(tmp_path, start_proxy, stack, front=False, top=fleet)
    proxy, asked = once.proxy, len(once.registry.requests())
    redis.stop()

    pulled = pull_afresh(tmp_path, once)
    never = http(f"{proxy.url}/v2/{once.image.repository}/manifests/never?ns={REGISTRY}", "HEAD")
    store, status = store_of(proxy), proxy.status()
    print(f"\npulled cut off from the fleet in {pulled.seconds:.1f}s; store {store}")
    assert status["fleet"]["connected"] is False, status["fleet"]
    assert store["stale"] >= 1, store
    assert store["reads"]["registry"] == len(once.image.blobs), store  # none since
    assert len(once.registry.requests()) == asked
    assert never[0] == 429, never  # it waited for the fleet through check.maxHold (P7)


# --- 3. a kill in the middle of a blob; the bound -------------------------------------------


def store_bytes(root: Path, under: tuple[str, ...] = ("tmp", "blobs")) -> int:
    """Bytes of the files under the store's ``tmp/`` and ``blobs/``, counted once each. ``tmp/``
    is read first: a file renamed into ``blobs/`` meanwhile is seen twice, under one inode,
    and counted once; a blob evicted to make room for bytes seen in ``tmp/`` was unlinked
    before they were written, so ``blobs/`` no longer shows it."""
    sizes: dict[int, int] = {}
    for directory in (root / name for name in under):
        for dirpath, _, names in os.walk(directory):
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    stat = os.stat(os.path.join(dirpath, name))
                    sizes[stat.st_ino] = max(sizes.get(stat.st_ino, 0), stat.st_size)
    return sum(sizes.values())


def tmp_bytes(root: Path) -> int:
    """Bytes of the store's temporary files (blobs being written)."""
    return store_bytes(root, ("tmp",))


def blob_file(root: Path, digest: str) -> Path:
    return root / "blobs" / "sha256" / digest.removeprefix("sha256:")


def get_blob(proxy: Kuikproxy, repository: str, digest: str, resource: str) -> bytes:
    status, _, body = http(
        f"{proxy.url}/v2/{repository}/blobs/{digest}?ns={REGISTRY}",
        headers={"Kuik-Resource": resource},
    )
    assert status == 200, (status, body[:300])
    return body


def test_a_kill_in_the_middle_of_a_blob_leaves_nothing_that_is_served(
    registry: DistributionRegistry,
    start_proxy: StartProxy,
    tmp_path: Path,
    stack: contextlib.ExitStack,
) -> None:
    """kuikproxy reads a 16 MiB blob through a front sending 8 MiB/s, and is SIGKILLed once
    a few MiB of it are in the store's ``tmp/``. Its client never sees the whole blob; nothing
    for that digest is under ``blobs/``. Restarted on the same store, kuikproxy deletes the
    temporary file, and the next GET of the blob is read from the registry again (its log) and
    arrives whole, its digest right; the one after that comes from the disk."""
    require_peers("nginx")
    repository = f"store/crash{time.time_ns()}"
    blob = Blob(OCI_LAYER, os.urandom(16 * MiB))
    push_blobs(registry, repository, [blob])
    front = stack.enter_context(slow_front(tmp_path / "nginx", registry, "8m"))
    root = tmp_path / "store"
    proxy = stack.enter_context(start_proxy(front.url, top=with_store(root)))

    got: list[int | BaseException] = []

    def client() -> None:
        try:
            got.append(len(get_blob(proxy, repository, blob.digest, "crash")))
        except BaseException as error:  # broken off by the kill
            got.append(error)

    reader = threading.Thread(target=client, daemon=True)
    reader.start()
    wait_for(lambda: tmp_bytes(root) >= 2 * MiB, 10, "a few MiB of the blob in tmp/")
    proxy.kill()
    reader.join(10)
    partial = [p.stat().st_size for p in (root / "tmp").iterdir()]
    assert got and got[0] != len(blob.data), got
    assert partial and all(0 < size < len(blob.data) for size in partial), partial
    assert not blob_file(root, blob.digest).exists()
    assert len(blob_gets(registry, blob.digest)) == 1

    proxy.start()  # the same config: the same store
    assert list((root / "tmp").iterdir()) == []
    assert not blob_file(root, blob.digest).exists()
    body = get_blob(proxy, repository, blob.digest, "after")
    assert "sha256:" + hashlib.sha256(body).hexdigest() == blob.digest
    assert len(blob_gets(registry, blob.digest)) == 2
    assert blob_file(root, blob.digest).stat().st_size == len(blob.data)
    assert get_blob(proxy, repository, blob.digest, "later") == blob.data
    assert len(blob_gets(registry, blob.digest)) == 2


def test_a_flood_of_distinct_blobs_never_takes_the_store_past_max_bytes(
    registry: DistributionRegistry,
    start_proxy: StartProxy,
    tmp_path: Path,
    stack: contextlib.ExitStack,
) -> None:
    """``maxBytes: 8Mi``; 32 distinct blobs of 1 MiB are read through kuikproxy, eight at a
    time. The files under the store's ``blobs/`` and ``tmp/``, sampled all along, never add up
    to more than 8 MiB, nor does ``/status`` ``cache.store.bytes``; every blob arrives right,
    and the store evicted to make room."""
    repository = f"store/flood{time.time_ns()}"
    blobs = [Blob(OCI_LAYER, os.urandom(MiB)) for _ in range(32)]
    push_blobs(registry, repository, blobs)
    root = tmp_path / "store"
    max_bytes = 8 * MiB
    proxy = stack.enter_context(
        start_proxy(registry.url, top=with_store(root, "8Mi"), copy={"idle": "5s"})
    )
    # the manifest opens a copy for the resource: its blob reads belong to it (§4.3)
    status, _, _ = http(
        f"{proxy.url}/v2/{repository}/manifests/v1?ns={REGISTRY}",
        headers={"Kuik-Resource": "flood", "Accept": OCI_MANIFEST},
    )
    assert status == 200

    done = threading.Event()
    on_disk: list[int] = []
    reported: list[int] = []

    def sample() -> None:
        while not done.is_set():
            on_disk.append(store_bytes(root))
            if len(on_disk) % 10 == 0:
                reported.append(store_of(proxy)["bytes"])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with ThreadPoolExecutor(8) as pool:
            bodies = list(pool.map(lambda b: get_blob(proxy, repository, b.digest, "flood"), blobs))
    finally:
        done.set()
        sampler.join(10)
    assert [hashlib.sha256(b).hexdigest() for b in bodies] == [
        b.digest.removeprefix("sha256:") for b in blobs
    ]
    store = store_of(proxy)
    print(f"\n{len(on_disk)} samples, at most {max(on_disk)} bytes on disk; store {store}")
    assert len(on_disk) > 20 and len(reported) > 2
    assert max(on_disk) <= max_bytes
    assert max(reported) <= max_bytes and store["bytes"] <= max_bytes, store
    assert store["evictions"] > 0, store
    assert store_bytes(root) <= max_bytes


# --- the moment a blob is put in place ----------------------------------------------------


async def test_a_client_arriving_while_a_blob_is_put_in_place_follows_the_one_read(
    registry: DistributionRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1 MiB blob is read from the registry for a first client; its temporary file has just
    been renamed into ``blobs/`` and the directory is being synced (slowly: 1.5 s here, tens of
    ms on a busy disk — the ten nodes above hit it now and then). A second client asks for the
    blob then: it should follow the one read (or be given the file now in place), not ask the
    registry again."""
    from kuikproxy.app import build_app
    from kuikproxy.blobs import disk
    from kuikproxy.config import parse_config

    repository = f"store/rename{time.time_ns()}"
    blob = Blob(OCI_LAYER, os.urandom(MiB))
    push_blobs(registry, repository, [blob])
    renamed = threading.Event()
    commit = disk.commit

    def slow_commit(fd: int, tmp: str, final: str) -> BinaryIO:
        file = commit(fd, tmp, final)  # renamed: what follows stands for a slow fsync of blobs/
        renamed.set()
        time.sleep(1.5)
        return file

    monkeypatch.setattr(disk, "commit", slow_commit)
    config = {
        "defaultRegistry": REGISTRY,
        "allowedHosts": [],
        "registries": {REGISTRY: registry_block(registry.url)},
        **with_store(tmp_path / "store"),
    }
    runner = web.AppRunner(build_app(parse_config(json.dumps(config))))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v2/{repository}/blobs/{blob.digest}"
    try:
        async with aiohttp.ClientSession() as session:

            async def get(resource: str) -> bytes:
                headers = {"Kuik-Resource": resource}
                async with session.get(url, params={"ns": REGISTRY}, headers=headers) as r:
                    assert r.status == 200
                    return await r.read()

            first = asyncio.create_task(get("first"))
            await asyncio.get_running_loop().run_in_executor(None, renamed.wait, 10)
            second = await get("second")
            assert await first == blob.data and second == blob.data
    finally:
        await runner.cleanup()
    assert len(blob_gets(registry, blob.digest)) == 1
