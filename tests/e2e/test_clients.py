"""Real clients pull through kuikproxy from the CNCF distribution registry (acceptance 1).

Each client names the image by its registry, ``registry.test:5000/app:v1``, a name that does not
resolve: the pull can only succeed through the mirror configured from ``examples/``, with
kuikproxy reaching the registry through its ``upstream``. The digests each client ends up with
are compared with the ones pushed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.e2e.conftest import DEAD_END, REGISTRY, StartProxy, registries_conf, require, workdir
from tests.e2e.peers import (
    EXAMPLES,
    OCI_INDEX,
    OCI_MANIFEST,
    Containerd,
    DistributionRegistry,
    Kuikproxy,
    LoggedRequest,
    RegistryClient,
    Run,
    SeededImage,
    clean_env,
    fenced_blocks,
    gaps,
    render_example,
    run,
    seed,
)

pytestmark = pytest.mark.e2e

TOLERANCE = 0.05
"""Seconds a gap between two windows may fall short of the interval at the registry. The
registry stamps a read when it reaches it, so one that left on time but reached it late (a new
connection, six clients starting at once on two loaded cores: 6 ms seen in CI) shortens the gap
after it. Two reads of one window would be milliseconds apart, so 50 ms still tells them from
one read per 200 ms window."""


@pytest.fixture
def stack() -> Iterator[contextlib.ExitStack]:
    """Cleanups that run when the test ends, passed or not."""
    with contextlib.ExitStack() as cleanups:
        yield cleanups


def oci_layout(path: Path) -> tuple[str, set[str]]:
    """The top manifest's digest in an OCI layout, and the digests of every blob it holds."""
    index = json.loads((path / "index.json").read_text())
    blobs = {f"sha256:{p.name}" for p in (path / "blobs" / "sha256").iterdir()}
    return index["manifests"][0]["digest"], blobs


def hosts_dir(tmp_path: Path, proxy: Kuikproxy, **replacements: str) -> Path:
    """``examples/containerd/hosts.toml`` installed for ``REGISTRY`` under a hosts directory,
    its fallback ``server`` a dead end on loopback."""
    root = tmp_path / "certs.d"
    dead_end = {'server = "https://registry.example:5000"': f'server = "https://{DEAD_END}"'}
    workdir(root, REGISTRY).joinpath("hosts.toml").write_text(
        render_example(
            "containerd/hosts.toml", proxy.host_port, REGISTRY, **dead_end, **replacements
        )
    )
    return root


def isolated_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No proxy variables and no auth file of the machine's: the client is anonymous."""
    auth = tmp_path / "no-auth.json"
    auth.write_text('{"auths": {}}')
    return clean_env(
        REGISTRY_AUTH_FILE=str(auth),
        DOCKER_CONFIG=str(tmp_path / "no-docker-config"),
        **extra,
    )


def explain(result: Run, proxy: Kuikproxy) -> str:
    return f"{result}\n--- kuikproxy log ---\n{proxy.log()}"


# --- containerd -----------------------------------------------------------------------------


def test_containerd_pulls_every_platform_through_the_hosts_toml_mirror(
    containerd: Containerd, mirror: Kuikproxy, app_image: SeededImage, tmp_path: Path
) -> None:
    """ctr with ``examples/containerd/hosts.toml`` (its optional ``Kuik-Resource`` header
    enabled) resolves and pulls every platform through kuikproxy, which reads the registry named
    by containerd's ``?ns=``; the image and content containerd stores have the pushed digests,
    and the header names the resource in ``/status``."""
    enable_header = {
        '# [host."http://127.0.0.1:7439".header]': '[host."http://127.0.0.1:7439".header]',
        "#   Kuik-Resource": "  Kuik-Resource",
    }
    certs = hosts_dir(tmp_path, mirror, **enable_header)
    ref = f"{REGISTRY}/app:v1"
    pull = containerd.ctr(
        "images", "pull", "--hosts-dir", str(certs), "--snapshotter", "native",
        "--all-platforms", ref,
    )  # fmt: skip
    assert pull.returncode == 0, explain(pull, mirror)

    listing = containerd.ctr("images", "ls")
    rows = {line.split()[0]: line.split() for line in listing.output.splitlines()[1:]}
    assert rows[ref][2] == app_image.index.digest, listing
    content = containerd.ctr("content", "ls", "--quiet")
    assert app_image.digests <= set(content.output.split()), content
    assert "node/worker-1" in mirror.status()["resources"]


# --- skopeo ---------------------------------------------------------------------------------


def test_skopeo_readme_copies_and_inspects_through_the_path_prefix_mirror(
    mirror: Kuikproxy, app_image: SeededImage, tmp_path: Path
) -> None:
    """The first block of ``examples/skopeo/README.md``, with ``examples/podman/registries.conf``
    (mirror ``<proxy>/registry.test-5000``: path-prefix addressing in kuik's ``<host>-<port>``
    spelling): ``skopeo copy --all`` stores the pushed index, both platform manifests and every
    blob; ``skopeo inspect --no-tags`` reports the index digest."""
    require("skopeo")
    conf = registries_conf(tmp_path, mirror)
    script = render_example("skopeo/README.md", mirror.host_port, REGISTRY)
    block = fenced_blocks(script)[0].replace("examples/podman/registries.conf", str(conf))
    result = run(["bash", "-euo", "pipefail", "-c", f"cd {tmp_path}\n{block}"], 60,
                 isolated_env(tmp_path))  # fmt: skip
    assert result.returncode == 0, explain(result, mirror)

    top, blobs = oci_layout(tmp_path / "app-layout")
    assert top == app_image.index.digest
    assert app_image.digests <= blobs
    inspected = json.loads((tmp_path / "app-inspect.json").read_text())
    assert inspected["Digest"] == app_image.index.digest


def test_skopeo_copies_through_a_bare_mirror_read_from_default_registry(
    mirror: Kuikproxy, app_image: SeededImage, tmp_path: Path
) -> None:
    """A mirror location without a namespace sends bare paths (``/v2/app/...``); kuikproxy
    reads them from ``defaultRegistry`` and skopeo gets the pushed digests."""
    require("skopeo")
    conf = tmp_path / "registries.conf"
    conf.write_text(
        f'[[registry]]\nprefix = "{REGISTRY}"\nlocation = "{DEAD_END}"\n'
        "mirror-by-digest-only = false\n"
        f'[[registry.mirror]]\nlocation = "{mirror.host_port}"\ninsecure = true\n'
    )
    layout = tmp_path / "layout"
    result = run(
        ["skopeo", "copy", "--registries-conf", str(conf), "--all",
         f"docker://{REGISTRY}/app:v1", f"oci:{layout}:v1"],
        60, isolated_env(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, explain(result, mirror)
    top, blobs = oci_layout(layout)
    assert top == app_image.index.digest
    assert app_image.digests <= blobs


# --- podman ---------------------------------------------------------------------------------


def test_podman_pulls_through_the_registries_conf_mirror(
    mirror: Kuikproxy, app_image: SeededImage, tmp_path: Path, stack: contextlib.ExitStack
) -> None:
    """podman, reading ``examples/podman/registries.conf`` from ``CONTAINERS_REGISTRIES_CONF``,
    pulls linux/amd64 of the image into private vfs storage; the stored image has the pushed
    index digest and the amd64 config as its id."""
    require("podman")
    conf = registries_conf(tmp_path, mirror)
    # podman refuses a runroot longer than 50 characters: pytest's tmp_path can be longer.
    runroot = stack.enter_context(tempfile.TemporaryDirectory(prefix="kuik-podman-"))
    podman = [
        "podman", "--root", str(tmp_path / "root"), "--runroot", runroot,
        "--tmpdir", str(tmp_path / "tmp"), "--storage-driver", "vfs",
        "--events-backend", "file", "--cgroup-manager", "cgroupfs",
    ]  # fmt: skip
    env = isolated_env(tmp_path, CONTAINERS_REGISTRIES_CONF=str(conf))
    pull = run([*podman, "pull", "--platform", "linux/amd64", f"{REGISTRY}/app:v1"], 90, env)
    assert pull.returncode == 0, explain(pull, mirror)

    images = run([*podman, "images", "--format", "json"], 30, env)
    assert images.returncode == 0, images
    [image] = json.loads(images.output)
    assert image["Digest"] == app_image.index.digest
    assert "sha256:" + image["Id"] == app_image.platform("linux/amd64").config.digest


# --- oras -----------------------------------------------------------------------------------


def test_oras_reads_the_index_a_platform_manifest_and_a_blob(
    mirror: Kuikproxy, app_image: SeededImage, tmp_path: Path
) -> None:
    """oras-py, talking to kuikproxy directly with the path-prefix host in the repository
    (``<proxy>/registry.test-5000/app``), reads the index by tag, a platform manifest by digest
    and its layer: each has the pushed digest."""
    oras_provider = pytest.importorskip("oras.provider")
    client = oras_provider.Registry(hostname=mirror.host_port, insecure=True)
    repository = f"{mirror.host_port}/{REGISTRY.replace(':', '-')}/app"

    index = client.get_manifest(f"{repository}:v1", allowed_media_type=[OCI_INDEX])
    amd64 = app_image.platform("linux/amd64")
    assert [m["digest"] for m in index["manifests"]] == [
        p.manifest.digest for p in app_image.platforms
    ]
    manifest = client.get_manifest(
        f"{repository}@{amd64.manifest.digest}", allowed_media_type=[OCI_MANIFEST]
    )
    assert manifest["config"]["digest"] == amd64.config.digest
    layer = tmp_path / "layer.tar.gz"
    client.download_blob(f"{repository}:v1", amd64.layer.digest, str(layer))
    assert "sha256:" + hashlib.sha256(layer.read_bytes()).hexdigest() == amd64.layer.digest


# --- pacing ---------------------------------------------------------------------------------


def _window_reads(
    rows: list[LoggedRequest], images: list[SeededImage]
) -> tuple[list[LoggedRequest], dict[str, LoggedRequest]]:
    """The registry's check reads (manifest HEADs) and, per image, the read that opened its
    copy: the first manifest GET by tag or by its index digest."""
    checks = [r for r in rows if r.kind == "manifests" and r.method == "HEAD"]
    openers = {}
    for image in images:
        gets = [
            r
            for r in rows
            if r.kind == "manifests"
            and r.method == "GET"
            and r.repository == image.repository
            and r.reference in (image.tag, image.index.digest)
        ]
        openers[image.repository] = min(gets, key=lambda r: r.started)
    return checks, openers


def test_the_registry_sees_one_manifest_read_per_window_and_blobs_at_once(
    registry: DistributionRegistry,
    start_proxy: StartProxy,
    containerd: Containerd,
    tmp_path: Path,
) -> None:
    """Three ctr pulls and three skopeo copies of six images, all at once, through one
    kuikproxy (check and copy every 200 ms, copies closing 200 ms after use). In the registry's
    own log, consecutive manifest HEADs (the check series) and consecutive copy-opening manifest
    GETs (the copy series, shared by both clients) are at least 200 ms apart; each image's
    platform manifest and blobs follow its opening read within the same window, and the copy
    windows used are exactly the copies opened."""
    require("skopeo")
    interval = 0.2
    writer = RegistryClient(registry.url)
    by_ctr = [seed(writer, f"pace/ctr-{n}") for n in range(3)]
    by_skopeo = [seed(writer, f"pace/skopeo-{n}") for n in range(3)]

    with start_proxy(registry.url) as proxy:
        certs = hosts_dir(tmp_path, proxy)
        conf = registries_conf(tmp_path, proxy)
        commands = [
            ["ctr", "--address", str(containerd.socket), "--namespace", "e2e", "images", "pull",
             "--hosts-dir", str(certs), "--snapshotter", "native", "--platform", "linux/amd64",
             f"{REGISTRY}/{image.repository}:{image.tag}"]
            for image in by_ctr
        ] + [
            ["skopeo", "copy", "--registries-conf", str(conf), "--all",
             f"docker://{REGISTRY}/{image.repository}:{image.tag}",
             f"oci:{tmp_path / image.repository.replace('/', '-')}:{image.tag}"]
            for image in by_skopeo
        ]  # fmt: skip
        since = time.time()
        with ThreadPoolExecutor(len(commands)) as pool:
            results = list(pool.map(lambda c: run(c, 60, isolated_env(tmp_path)), commands))
        for result in results:
            assert result.returncode == 0, explain(result, proxy)
        status = proxy.status()["registries"][REGISTRY]

    images = by_ctr + by_skopeo
    rows = registry.requests(since)
    checks, openers = _window_reads(rows, images)
    timeline = "\n".join(f"{r.started - since:7.3f} {r.method:4} {r.uri[:90]}" for r in rows)
    assert len(checks) >= len(by_ctr), timeline
    assert min(gaps(checks)) >= interval - TOLERANCE, timeline
    assert min(gaps(list(openers.values()))) >= interval - TOLERANCE, timeline
    assert status["copy"]["windows"]["used"] == len(images), (status, timeline)

    for image in images:
        opener = openers[image.repository]
        content = [
            r
            for r in rows
            if r.repository == image.repository and r is not opener and r.method == "GET"
        ]
        assert content, f"no content read for {image.repository}\n{timeline}"
        assert max(r.started for r in content) - opener.started < interval, timeline


def test_examples_name_the_same_proxy_and_registry() -> None:
    """The examples are templated by the tests: each must spell kuikproxy's example address
    and the example registry exactly as the tests substitute them."""
    for relative in ("containerd/hosts.toml", "podman/registries.conf", "skopeo/README.md"):
        text = (EXAMPLES / relative).read_text()
        assert "127.0.0.1:7439" in text, relative
        assert "registry.example:5000" in text, relative
