"""Pulls through kuikproxy from a registry behind docker token auth (acceptance 2).

The registry trusts only the test token server: anyone may pull ``public/*``, only alice
``private/*``. kuikproxy either holds alice's credentials itself (every client then pulls
without any), or holds none and passes each client's own ``Authorization`` through — in which
case an answer obtained with alice's token never serves anyone else (SPEC R5), while a refusal
with its challenge is an answer that serves every anonymous client (R4).
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import REGISTRY, StartProxy, registries_conf, require
from tests.e2e.peers import (
    OCI_INDEX,
    DistributionRegistry,
    Kuikproxy,
    Run,
    SeededImage,
    TokenServer,
    clean_env,
    fenced_blocks,
    http,
    parse_challenge,
    render_example,
    run,
)

pytestmark = pytest.mark.e2e

PREFIX = REGISTRY.replace(":", "-")
"""The registry as the first path segment of a path-prefix request (kuik's spelling)."""


def explain(result: Run | str, proxy: Kuikproxy) -> str:
    return f"{result}\n--- kuikproxy log ---\n{proxy.log()}"


def skopeo_copy(proxy: Kuikproxy, image: SeededImage, tmp_path: Path, *options: str) -> Run:
    """``skopeo copy --all`` of ``REGISTRY/<image>`` through the example registries.conf into an
    OCI layout ``tmp_path/layout``; anonymous unless ``options`` bring an ``--authfile``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    conf = registries_conf(tmp_path, proxy)
    empty = tmp_path / "no-auth.json"
    empty.write_text('{"auths": {}}')
    return run(
        ["skopeo", "copy", "--registries-conf", str(conf), *options, "--all",
         f"docker://{REGISTRY}/{image.repository}:{image.tag}", f"oci:{tmp_path / 'layout'}:v1"],
        60,
        clean_env(REGISTRY_AUTH_FILE=str(empty), DOCKER_CONFIG=str(tmp_path / "no-docker")),
    )  # fmt: skip


def layout_top(tmp_path: Path) -> str:
    index = json.loads((tmp_path / "layout" / "index.json").read_text())
    digest: str = index["manifests"][0]["digest"]
    return digest


def manifest(
    proxy: Kuikproxy, image: SeededImage, method: str = "GET", **headers: str
) -> tuple[int, Any, bytes]:
    """A manifest read by tag through kuikproxy, path-prefix addressed, without credentials."""
    url = f"{proxy.url}/v2/{PREFIX}/{image.repository}/manifests/{image.tag}"
    return http(url, method, headers={"Accept": OCI_INDEX, **headers})


def test_kuikproxy_own_credentials_let_clients_without_any_pull_a_private_image(
    secure_registry: DistributionRegistry,
    token_server: TokenServer,
    private_image: SeededImage,
    start_proxy: StartProxy,
    tmp_path: Path,
) -> None:
    """kuikproxy configured with alice's credentials for the registry (``username`` +
    ``passwordFile``) answers the mirror ping 200, does the token dance itself, and an
    anonymous skopeo copies ``private/app:v1`` with the pushed digests; the token server saw
    alice ask for pull on ``private/app``."""
    require("skopeo")
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    credentials = {"username": "alice", "passwordFile": str(password)}
    with start_proxy(secure_registry.url, credentials=credentials) as proxy:
        status, _, _ = http(f"{proxy.url}/v2/")
        assert status == 200, explain(f"GET /v2/ -> {status}", proxy)
        result = skopeo_copy(proxy, private_image, tmp_path)
        assert result.returncode == 0, explain(result, proxy)
    assert layout_top(tmp_path) == private_image.index.digest
    assert any(
        t.user == "alice" and ("private/app", ("pull",)) in t.access for t in token_server.issued
    ), token_server.issued


def test_anonymous_clients_pull_a_public_image_with_their_own_anonymous_token(
    secure_registry: DistributionRegistry,
    public_image: SeededImage,
    start_proxy: StartProxy,
    tmp_path: Path,
) -> None:
    """Without credentials of its own, kuikproxy relays the registry's 401 challenge; skopeo
    fetches an anonymous token from the realm, kuikproxy passes it through, and the copy of
    ``public/app:v1`` has the pushed digests."""
    require("skopeo")
    with start_proxy(secure_registry.url) as proxy:
        result = skopeo_copy(proxy, public_image, tmp_path)
        assert result.returncode == 0, explain(result, proxy)
    assert layout_top(tmp_path) == public_image.index.digest


def test_an_answer_read_with_a_client_token_never_serves_a_client_without_it(
    secure_registry: DistributionRegistry,
    private_image: SeededImage,
    start_proxy: StartProxy,
    tmp_path: Path,
) -> None:
    """The README's private block: skopeo with ``--authfile`` keyed by kuikproxy's address
    (alice) copies ``private/app:v1`` through kuikproxy, which holds no credentials. Then the
    same manifest asked without credentials, by tag and by digest, is the registry's 401 with
    its Bearer challenge — never the 200 kept from alice's read — and an anonymous skopeo
    fails."""
    require("skopeo")
    with start_proxy(secure_registry.url) as proxy:
        conf = registries_conf(tmp_path, proxy)
        script = render_example("skopeo/README.md", proxy.host_port, REGISTRY)
        block = fenced_blocks(script)[1].replace("examples/podman/registries.conf", str(conf))
        result = run(["bash", "-euo", "pipefail", "-c", f"cd {tmp_path}\n{block}"], 60,
                     clean_env(DOCKER_CONFIG=str(tmp_path / "no-docker")))  # fmt: skip
        assert result.returncode == 0, explain(result, proxy)
        auths = json.loads((tmp_path / "kuik-auth.json").read_text())["auths"]
        assert base64.b64decode(auths[proxy.host_port]["auth"]) == b"alice:s3cret"
        top = json.loads((tmp_path / "private-layout" / "index.json").read_text())
        assert top["manifests"][0]["digest"] == private_image.index.digest

        for method in ("GET", "HEAD"):
            status, headers, body = manifest(proxy, private_image, method, **{"Kuik-Resource": "x"})
            assert status == 401, explain(f"{method} -> {status} {body[:200]!r}", proxy)
            assert parse_challenge(headers["WWW-Authenticate"])[0] == "bearer"
            assert private_image.index.data not in body
        url = f"{proxy.url}/v2/{PREFIX}/private/app/manifests/{private_image.index.digest}"
        status, _, body = http(url, headers={"Accept": OCI_INDEX})
        assert status == 401, explain(f"GET by digest -> {status} {body[:200]!r}", proxy)

        anonymous = skopeo_copy(proxy, private_image, tmp_path / "anonymous")
        assert anonymous.returncode != 0, anonymous


def test_a_kept_401_challenge_answers_another_anonymous_client_without_a_window(
    secure_registry: DistributionRegistry,
    private_image: SeededImage,
    start_proxy: StartProxy,
) -> None:
    """A 401 with its challenge is an answer (R4): the first anonymous check of
    ``private/app:v1`` waits for a window (1 s here) and gets the registry's 401; a second
    anonymous client (another resource) asking the same gets the same challenge at once, and
    the registry saw no read of that manifest after the first answer."""
    interval = 1.0
    with start_proxy(secure_registry.url, check={"interval": "1s"}) as proxy:
        since = time.time()
        first = manifest(proxy, private_image, "HEAD", **{"Kuik-Resource": "first"})
        assert first[0] == 401, explain(f"first -> {first[0]}", proxy)
        asked, started = time.time(), time.monotonic()
        second = manifest(proxy, private_image, "HEAD", **{"Kuik-Resource": "second"})
        took = time.monotonic() - started
        assert second[0] == 401, explain(f"second -> {second[0]}", proxy)
    assert second[1]["WWW-Authenticate"] == first[1]["WWW-Authenticate"]
    assert took < interval / 2, f"the second client waited {took:.3f}s: a window"
    reads = [
        r
        for r in secure_registry.requests(since)
        if r.kind == "manifests" and r.repository == "private/app"
    ]
    assert reads, "the first check never reached the registry"
    assert all(r.started < asked for r in reads), reads
