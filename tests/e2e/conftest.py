"""Session-wide peers for the end-to-end tests: an anonymous registry, a token-auth registry and
its token server, containerd; and a way to start kuikproxy before either registry.

The registry is named ``registry.test:5000`` everywhere (``.test`` never resolves, RFC 6761);
kuikproxy reaches it through ``upstream``. The client configs rendered from ``examples/`` point
the clients' fallback (the registry itself) at a closed loopback port, so a client can only
succeed through kuikproxy, and a failing test never sends anything off the machine, not even a
DNS query. Every kuikproxy is locked down (``allowedHosts: []``, ``defaultRegistry`` the test
registry): it never contacts a public registry either.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.peers import (
    Containerd,
    CriContainerd,
    DistributionRegistry,
    Kuikproxy,
    RegistryClient,
    SeededImage,
    TokenServer,
    free_port,
    registry_block,
    render_example,
    seed,
)

REGISTRY = "registry.test:5000"
"""The registry's name in images, kuikproxy's config and the examples."""
DEAD_END = f"127.0.0.1:{free_port()}"
"""Where rendered client configs send the fallback to the registry itself: a closed port."""
APT = "apt-get install -y docker-registry skopeo podman containerd"


def require(binary: str) -> None:
    """Skip the test, with the reason, when a client or peer binary is not installed."""
    if shutil.which(binary) is None:
        pytest.skip(f"{binary} is not installed ({APT})")


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DistributionRegistry]:
    """An anonymous distribution registry."""
    require(DistributionRegistry.binary)
    with DistributionRegistry(tmp_path_factory.mktemp("registry")) as peer:
        yield peer


@pytest.fixture(scope="session")
def app_image(registry: DistributionRegistry) -> SeededImage:
    """``app:v1`` on the anonymous registry: an index of linux/amd64 and linux/arm64."""
    return seed(RegistryClient(registry.url), "app", "v1")


@pytest.fixture(scope="session")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenServer]:
    """Users alice (``private/*``, ``public/*``) and writer (everything); anyone ``public/*``."""
    with TokenServer(tmp_path_factory.mktemp("token")) as server:
        yield server


@pytest.fixture(scope="session")
def secure_registry(
    token_server: TokenServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DistributionRegistry]:
    """A distribution registry that trusts ``token_server``'s tokens and nothing else."""
    require(DistributionRegistry.binary)
    with DistributionRegistry(tmp_path_factory.mktemp("secure"), token=token_server) as peer:
        yield peer


@pytest.fixture(scope="session")
def private_image(secure_registry: DistributionRegistry) -> SeededImage:
    """``private/app:v1`` on the token-auth registry: only alice may pull it."""
    return seed(RegistryClient(secure_registry.url, ("writer", "wr1ter")), "private/app", "v1")


@pytest.fixture(scope="session")
def public_image(secure_registry: DistributionRegistry) -> SeededImage:
    """``public/app:v1`` on the token-auth registry: anyone may pull it, with a token."""
    return seed(RegistryClient(secure_registry.url, ("writer", "wr1ter")), "public/app", "v1")


@pytest.fixture(scope="session")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    """A private containerd daemon (CRI off, native snapshotter)."""
    require("containerd")
    require("ctr")
    with Containerd(tmp_path_factory.mktemp("containerd")) as daemon:
        yield daemon


@pytest.fixture(scope="session")
def cri_containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CriContainerd]:
    """A private containerd daemon with its CRI plugin on (image pulls only: no kubelet, no
    CNI), reading registry hosts from ``cri_containerd.certs`` as a node reads
    ``/etc/containerd/certs.d``; ``ctr`` works against it too."""
    require("containerd")
    require("ctr")
    root = tmp_path_factory.mktemp("cri-containerd")
    certs = workdir(root, "certs.d")
    with CriContainerd(root / "daemon", certs) as daemon:
        yield daemon


StartProxy = Callable[..., contextlib.AbstractContextManager[Kuikproxy]]


@pytest.fixture(scope="session")
def start_proxy(tmp_path_factory: pytest.TempPathFactory) -> StartProxy:
    """``start_proxy(upstream, top={...}, **block)``: a kuikproxy serving ``REGISTRY`` from
    ``upstream`` with 200 ms windows (``block`` merged into the registry's block, ``top`` into
    the document), as a context manager."""

    @contextlib.contextmanager
    def start(
        upstream: str, top: dict[str, Any] | None = None, **block: Any
    ) -> Iterator[Kuikproxy]:
        config = {
            "defaultRegistry": REGISTRY,
            "allowedHosts": [],
            "registries": {REGISTRY: registry_block(upstream, **block)},
            **(top or {}),
        }
        with Kuikproxy(tmp_path_factory.mktemp("kuikproxy"), config) as proxy:
            yield proxy

    return start


@pytest.fixture(scope="module")
def mirror(registry: DistributionRegistry, start_proxy: StartProxy) -> Iterator[Kuikproxy]:
    """kuikproxy before the anonymous registry; bare paths go to it too (``defaultRegistry``)."""
    with start_proxy(registry.url) as proxy:
        yield proxy


def workdir(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def registries_conf(tmp_path: Path, proxy: Kuikproxy) -> Path:
    """``examples/podman/registries.conf`` with kuikproxy's address and ``REGISTRY``, the
    registry's own ``location`` (the clients' fallback) a dead end on loopback."""
    path = tmp_path / "registries.conf"
    dead_end = {'location = "registry.example:5000"': f'location = "{DEAD_END}"'}
    path.write_text(render_example("podman/registries.conf", proxy.host_port, REGISTRY, **dead_end))
    return path
