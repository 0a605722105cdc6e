"""Forward-proxy mode with real Go clients (SPEC §13).

kube-image-keeper's controllers cannot be given a mirror; they honour ``HTTPS_PROXY`` and
``SSL_CERT_FILE``, as skopeo and podman do. Here both pull the two-platform image from the
distribution registry serving TLS on loopback, through kuikproxy as their ``HTTPS_PROXY``:
kuikproxy intercepts each ``CONNECT registry.test:PORT`` with a leaf from its own CA (which the
clients trust through ``kuikproxy ca bundle``), paces the reads, and reads the registry over
verified TLS. Go clients bypass the proxy for loopback addresses, so they are given the
registry's name, ``registry.test`` (which never resolves: only kuikproxy knows where it is).
"""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.certs import self_signed
from tests.e2e.conftest import require
from tests.e2e.peers import (
    LOOPBACK,
    DistributionRegistry,
    Kuikproxy,
    RegistryClient,
    SeededImage,
    TLSRegistry,
    clean_env,
    registry_block,
    run,
    seed,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tls_registry(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[TLSRegistry, SeededImage]]:
    """``app:v1`` pushed over plain HTTP, then the same storage served over TLS."""
    require(DistributionRegistry.binary)
    workdir = tmp_path_factory.mktemp("tls-registry")
    with DistributionRegistry(workdir) as plain:
        image = seed(RegistryClient(plain.url), "app", "v1")
    cert, key = self_signed(workdir)
    with TLSRegistry(workdir, cert, key) as secure:
        yield secure, image


@pytest.fixture(scope="module")
def forward_proxy(
    tls_registry: tuple[TLSRegistry, SeededImage], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Kuikproxy, str, Path]]:
    """kuikproxy as a forward proxy for ``registry.test:PORT``; the clients' CA bundle."""
    registry, _ = tls_registry
    name = f"registry.test:{registry.port}"
    workdir = tmp_path_factory.mktemp("forward-proxy")
    config = {
        "allowedHosts": [],
        "defaultRegistry": name,
        "forwardProxy": {
            "enabled": True,
            "ca": {"certFile": str(workdir / "ca.crt"), "keyFile": str(workdir / "ca.key")},
        },
        "registries": {
            name: registry_block(
                f"https://127.0.0.1:{registry.port}", tls={"caFile": str(registry.cert)}
            )
        },
    }
    with Kuikproxy(workdir, config) as proxy:
        bundle = workdir / "bundle.pem"
        made = subprocess.run(
            [sys.executable, "-m", "kuikproxy", "ca", "bundle", "--config",
             str(workdir / "kuikproxy.yaml"), "--output", str(bundle)],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        yield proxy, name, bundle


def client_env(tmp_path: Path, proxy: Kuikproxy, bundle: Path) -> dict[str, str]:
    """A Go client's environment as the injected sidecar makes it: kuikproxy as its proxy,
    the bundle as its roots, no registries.conf or credentials of the machine's."""
    conf = tmp_path / "registries.conf"
    conf.write_text("")
    auth = tmp_path / "no-auth.json"
    auth.write_text('{"auths": {}}')
    return clean_env(
        HTTPS_PROXY=proxy.url,
        SSL_CERT_FILE=str(bundle),
        CONTAINERS_REGISTRIES_CONF=str(conf),
        REGISTRY_AUTH_FILE=str(auth),
        DOCKER_CONFIG=str(tmp_path / "no-docker-config"),
    )


def test_skopeo_copies_every_platform_through_the_forward_proxy(
    forward_proxy: tuple[Kuikproxy, str, Path],
    tls_registry: tuple[TLSRegistry, SeededImage],
    tmp_path: Path,
) -> None:
    require("skopeo")
    proxy, name, bundle = forward_proxy
    registry, image = tls_registry
    since = time.time()
    layout = tmp_path / "layout"
    result = run(
        ["skopeo", "copy", "--all", f"docker://{name}/app:v1", f"oci:{layout}:v1"],
        90, client_env(tmp_path, proxy, bundle),
    )  # fmt: skip
    assert result.returncode == 0, f"{result}\n--- kuikproxy ---\n{proxy.log()}"
    index = json.loads((layout / "index.json").read_text())
    blobs = {f"sha256:{p.name}" for p in (layout / "blobs" / "sha256").iterdir()}
    assert index["manifests"][0]["digest"] == image.index.digest
    assert image.digests <= blobs
    paced(proxy, name, registry, since)


def test_podman_pulls_through_the_forward_proxy(
    forward_proxy: tuple[Kuikproxy, str, Path],
    tls_registry: tuple[TLSRegistry, SeededImage],
    tmp_path: Path,
) -> None:
    require("podman")
    proxy, name, bundle = forward_proxy
    registry, image = tls_registry
    since = time.time()
    # podman refuses a runroot longer than 50 characters: pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="kuik-podman-") as runroot:
        podman = [
            "podman", "--root", str(tmp_path / "root"), "--runroot", runroot,
            "--tmpdir", str(tmp_path / "tmp"), "--storage-driver", "vfs",
            "--events-backend", "file", "--cgroup-manager", "cgroupfs",
        ]  # fmt: skip
        env = client_env(tmp_path, proxy, bundle)
        pull = run([*podman, "pull", "--platform", "linux/amd64", f"{name}/app:v1"], 90, env)
        assert pull.returncode == 0, f"{pull}\n--- kuikproxy ---\n{proxy.log()}"
        images = run([*podman, "images", "--format", "json"], 30, env)
    [stored] = json.loads(images.output)
    assert stored["Digest"] == image.index.digest
    assert "sha256:" + stored["Id"] == image.platform("linux/amd64").config.digest
    paced(proxy, name, registry, since)


def paced(proxy: Kuikproxy, name: str, registry: TLSRegistry, since: float) -> None:
    """The pull's manifest read by tag came at a copy window of kuikproxy's; reads by tag are
    never closer together than the copy interval (200 ms)."""
    copy = proxy.status()["registries"][name]["copy"]
    assert copy["windows"]["used"] >= 1
    by_tag = sorted(
        r.started
        for r in registry.requests(since)
        if r.kind == "manifests" and not r.reference.startswith("sha256:")
    )
    assert by_tag
    assert all(b - a >= 0.2 - 0.005 for a, b in itertools.pairwise(by_tag))


def test_a_connect_to_a_host_not_allowed_is_refused(
    forward_proxy: tuple[Kuikproxy, str, Path],
) -> None:
    proxy, _, _ = forward_proxy
    with socket.create_connection((LOOPBACK, proxy.port), 5) as connection:
        connection.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        answer = connection.recv(4096)
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert b"DENIED" in answer
