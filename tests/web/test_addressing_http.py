"""Which registry host a request is for (SPEC §3): ns, path prefix, Host alias, default."""

from __future__ import annotations

import pytest

from tests.conftest import HOST, ProxyFactory
from tests.upstream_app import Registry

pytestmark = pytest.mark.looptime

FAST = "check: {interval: 10ms}"


async def test_s3_ns_names_the_host_and_the_answer_says_oci_namespace(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """``?ns=<host>`` (containerd's mirror parameter) names the host; the answer carries
    ``OCI-Namespace`` and ``ns`` is not forwarded."""
    fake, _ = registry
    client = await proxy(FAST)
    response = await client.head(f"/v2/app/manifests/v1?ns={HOST}")
    assert response.status == 200
    assert response.headers["OCI-Namespace"] == HOST
    assert fake.reads()[0].path == "/v2/app/manifests/v1"


async def test_s3_path_prefix_names_the_host(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """``/v2/<host>/<repository>/...``: a first segment with a dot names the host and is taken
    off the repository; no ``OCI-Namespace`` without ``ns``."""
    fake, _ = registry
    client = await proxy(FAST)
    response = await client.head(f"/v2/{HOST}/team/app/manifests/v1")
    assert response.status == 200
    assert "OCI-Namespace" not in response.headers
    assert fake.reads()[0].path == "/v2/team/app/manifests/v1"


async def test_s3_path_prefix_with_kuik_dash_port_spelling(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """kuik v1 spells a port with a dash: ``registry.test-5000`` is ``registry.test:5000``."""
    fake, _ = registry
    client = await proxy(FAST, host="registry.test:5000")
    response = await client.head("/v2/registry.test-5000/app/manifests/v1")
    assert response.status == 200
    assert fake.reads()[0].path == "/v2/app/manifests/v1"
    response = await client.head("/v2/registry.test:5000/app/manifests/v2")
    assert response.status == 200


async def test_s3_path_prefix_of_a_host_not_allowed_is_denied_never_a_repository(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A first segment that names a host always names it: a host that is not allowed is 403,
    not read as a repository on the default registry."""
    fake, _ = registry
    client = await proxy(FAST, top=f"defaultRegistry: {HOST}\nallowedHosts: []")
    for path in (
        "/v2/evil.example/app/manifests/v1",
        "/v2/localhost/app/manifests/v1",
        "/v2/evil.example:443/app/manifests/v1",
    ):
        response = await client.head(path)
        assert response.status == 403, path
    assert fake.seen == []


async def test_s3_host_alias_by_host_header(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A request whose Host header is a ``hostAliases`` key goes to that alias's registry,
    with or without a port in the header."""
    fake, _ = registry
    client = await proxy(
        FAST,
        top=f"hostAliases: {{mirror.local: {HOST}}}\nallowedHosts: []\ndefaultRegistry: {HOST}",
    )
    for host_header in ("mirror.local", "mirror.local:7439", "MIRROR.local"):
        response = await client.head("/v2/app/manifests/v1", headers={"Host": host_header})
        assert response.status == 200, host_header
    assert len(fake.seen) >= 1


async def test_s3_bare_paths_go_to_the_default_registry(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """Without ns, prefix or alias, the request is for ``defaultRegistry``."""
    fake, _ = registry
    client = await proxy(FAST, top=f"defaultRegistry: {HOST}")
    response = await client.head("/v2/team/app/manifests/v1")
    assert response.status == 200
    assert fake.reads()[0].path == "/v2/team/app/manifests/v1"


async def test_s2_docker_hub_names_fold_and_single_segments_get_library(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """``index.docker.io`` and ``registry-1.docker.io`` are ``docker.io``; a single-segment
    repository there gets ``library/``."""
    fake, _ = registry
    client = await proxy(FAST, host="docker.io")
    for name in ("index.docker.io", "registry-1.docker.io", "docker.io"):
        response = await client.head(f"/v2/nginx/manifests/1.27?ns={name}")
        assert response.status == 200, name
    response = await client.head("/v2/registry-1.docker.io/nginx/manifests/1.27")
    assert response.status == 200
    assert {s.path for s in fake.reads()} == {"/v2/library/nginx/manifests/1.27"}
