"""A registry served over TLS, as production registries are, read by kuikproxy as a mirror.

Layers of a few MiB come in bodies that kuikproxy takes from aiohttp and relays in a thread,
decrypted on the loop into the thread's ring (kuikproxy.upstream.decrypted): with the
distribution registry's own TLS (Go's record sizes and its end of the session), skopeo copies
every platform and checks every digest; a layer whose bytes in the registry's storage are not
its digest's is never served whole, on any read.
"""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.certs import self_signed
from tests.e2e.conftest import REGISTRY, StartProxy, registries_conf, require
from tests.e2e.peers import (
    DistributionRegistry,
    Kuikproxy,
    RegistryClient,
    SeededImage,
    TLSRegistry,
    build_image,
    push_image,
    run,
)
from tests.e2e.test_clients import isolated_env, oci_layout

pytestmark = pytest.mark.e2e

FILLER = 3 * 1024 * 1024  # bytes of each layer that do not compress: well past the 1 MiB that
# sends a body to a thread


@pytest.fixture(scope="module")
def big_images(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[TLSRegistry, SeededImage, SeededImage]]:
    """``big:v1`` and ``spoiled:v1`` (both with layers of 3 MiB and more) pushed over plain
    HTTP, then the same storage served over TLS, ``spoiled``'s first layer altered on disk."""
    require(DistributionRegistry.binary)
    workdir = tmp_path_factory.mktemp("tls-upstream")
    with DistributionRegistry(workdir) as plain:
        client = RegistryClient(plain.url)
        big = push_image(client, build_image("big", "v1", filler=FILLER))
        spoiled = push_image(client, build_image("spoiled", "v1", filler=FILLER))
    data = stored(workdir, spoiled.platforms[0].layer.digest)
    content = bytearray(data.read_bytes())
    content[-1] ^= 1  # the registry serves what it stores: the last byte is not the digest's
    data.write_bytes(bytes(content))
    cert, key = self_signed(workdir)
    with TLSRegistry(workdir, cert, key) as secure:
        yield secure, big, spoiled


def stored(workdir: Path, digest: str) -> Path:
    """Where the distribution registry's filesystem storage keeps a blob's bytes."""
    hexdigest = digest.removeprefix("sha256:")
    return workdir / "storage/docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"


@pytest.fixture(scope="module")
def tls_mirror(
    big_images: tuple[TLSRegistry, SeededImage, SeededImage], start_proxy: StartProxy
) -> Iterator[Kuikproxy]:
    """kuikproxy reading ``REGISTRY`` from the TLS registry, trusting its certificate."""
    registry = big_images[0]
    upstream = f"https://127.0.0.1:{registry.port}"
    with start_proxy(upstream, tls={"caFile": str(registry.cert)}, paced=False) as proxy:
        yield proxy


def test_skopeo_copies_large_layers_read_over_tls(
    tls_mirror: Kuikproxy,
    big_images: tuple[TLSRegistry, SeededImage, SeededImage],
    tmp_path: Path,
) -> None:
    """Every platform of ``big:v1`` copied through the mirror: skopeo checks each blob's
    digest, and the layout holds every blob pushed."""
    require("skopeo")
    _, big, _ = big_images
    conf = registries_conf(tmp_path, tls_mirror)  # the shipped example
    env = isolated_env(tmp_path)
    layout = tmp_path / "layout"
    result = run(
        ["skopeo", "copy", "--registries-conf", str(conf), "--all",
         f"docker://{REGISTRY}/big:v1", f"oci:{layout}:v1"],
        120, env,
    )  # fmt: skip
    assert result.returncode == 0, f"{result}\n--- kuikproxy log ---\n{tls_mirror.log()}"
    top, copied = oci_layout(layout)
    assert top == big.index.digest
    assert big.digests <= copied


def test_a_layer_stored_with_other_bytes_is_never_served_whole(
    tls_mirror: Kuikproxy, big_images: tuple[TLSRegistry, SeededImage, SeededImage]
) -> None:
    """The registry serves ``spoiled``'s layer with its last byte changed: each GET through
    kuikproxy announces the full length, then breaks off before its end (the last piece is
    held until the whole is hashed), the first read as the next — nothing was kept."""
    _, _, spoiled = big_images
    layer = spoiled.platforms[0].layer
    for _ in range(2):
        connection = http.client.HTTPConnection("127.0.0.1", tls_mirror.port, timeout=60)
        try:
            connection.request("GET", f"/v2/spoiled/blobs/{layer.digest}")
            response = connection.getresponse()
            assert response.status == 200
            assert int(response.headers["Content-Length"]) == len(layer.data)
            with pytest.raises(http.client.IncompleteRead) as broken:
                response.read()
            assert len(broken.value.partial) < len(layer.data)
            assert broken.value.partial == layer.data[: len(broken.value.partial)]
        finally:
            connection.close()
    assert "spoiled" in tls_mirror.log()
