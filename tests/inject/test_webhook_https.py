"""The webhook over HTTPS on loopback, as the API server calls it: a real AdmissionReview in,
an AdmissionReview response out, the patch applied and the Pod validated for Kubernetes 1.30."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes_validate
import pytest
from aiohttp import web
from cryptography import x509

from kuikproxy.errors import ConfigError
from kuikproxy.inject.patch import NO_PROXY
from kuikproxy.inject.webhook import MAX_REVIEW_BYTES, ServingCertificate, build_app
from tests.certs import Authority, replace, stray_key
from tests.inject.jsonpatch import apply
from tests.inject.pods import SETTINGS, kuik_review


@dataclass
class Webhook:
    url: str
    session: aiohttp.ClientSession
    authority: Authority
    certificate: ServingCertificate
    cert_file: Path
    key_file: Path

    async def post(self, body: bytes) -> tuple[int, bytes]:
        # a stream, so that aiohttp sends a large body without a warning
        async with self.session.post(f"{self.url}/mutate", data=io.BytesIO(body)) as answer:
            return answer.status, await answer.read()

    async def review(self, review: dict[str, Any]) -> dict[str, Any]:
        """POST ``review``; its response, after checking the envelope."""
        status, body = await self.post(json.dumps(review).encode())
        assert status == 200, body
        answer: dict[str, Any] = json.loads(body)
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert answer["kind"] == "AdmissionReview"
        assert answer["response"]["uid"] == review["request"]["uid"]
        assert answer["response"]["allowed"] is True
        response: dict[str, Any] = answer["response"]
        return response

    async def served_certificate(self) -> x509.Certificate:
        """The certificate a new connection is shown."""
        host, port = self.url.removeprefix("https://").split(":")
        _, writer = await asyncio.open_connection(
            host, int(port), ssl=self.authority.client_context()
        )
        try:
            der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        finally:
            writer.close()
            await writer.wait_closed()
        return x509.load_der_x509_certificate(der)


@pytest.fixture
async def webhook(tmp_path: Path) -> AsyncIterator[Webhook]:
    """The webhook's app on 127.0.0.1 with a certificate from a throwaway CA, and a client
    that trusts that CA only (as the API server trusts the caBundle)."""
    authority = Authority()
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    authority.issue(cert_file, key_file, "first")
    certificate = ServingCertificate(cert_file, key_file)
    runner = web.AppRunner(build_app(SETTINGS, certificate))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=certificate.context)
    await site.start()
    port = runner.addresses[0][1]
    connector = aiohttp.TCPConnector(ssl=authority.client_context())
    async with aiohttp.ClientSession(connector=connector) as session:
        yield Webhook(
            f"https://127.0.0.1:{port}", session, authority, certificate, cert_file, key_file
        )
    await runner.cleanup()


async def test_the_kuik_controllers_pod_is_injected(webhook: Webhook) -> None:
    """kube-image-keeper's controllers pod: its container gets the proxy variables (its own
    no_proxy kept) and the CA bundle, the pod the sidecar and its volumes; the result is a
    valid Kubernetes 1.30 Pod, and the memory annotation sized the sidecar."""
    review = kuik_review()
    response = await webhook.review(review)
    assert response["patchType"] == "JSONPatch"
    assert "warnings" not in response
    patch = json.loads(base64.b64decode(response["patch"]))
    assert [(operation["op"], operation["path"]) for operation in patch] == [
        ("add", "/spec/containers/0/env/-"),
        ("add", "/spec/containers/0/env/-"),
        ("add", "/spec/containers/0/env/-"),
        ("add", "/spec/containers/0/env/-"),
        ("add", "/spec/containers/0/volumeMounts/-"),
        ("add", "/spec/volumes/-"),
        ("add", "/spec/volumes/-"),
        ("add", "/spec/volumes/-"),
        ("add", "/spec/volumes/-"),
        ("add", "/spec/volumes/-"),
        ("add", "/spec/containers/-"),
    ]
    assert [operation["value"] for operation in patch[:5]] == [
        {"name": "HTTPS_PROXY", "value": "http://127.0.0.1:7439"},
        {"name": "HTTP_PROXY", "value": "http://127.0.0.1:7439"},
        {"name": "NO_PROXY", "value": NO_PROXY + ",$(no_proxy)"},
        {"name": "SSL_CERT_FILE", "value": "/etc/kuikproxy/ca/bundle.pem"},
        {"name": "kuikproxy-ca-bundle", "mountPath": "/etc/kuikproxy/ca", "readOnly": True},
    ]
    original = review["request"]["object"]
    pod = apply(original, patch)
    kubernetes_validate.validate(pod, "1.30", strict=True)

    manager, sidecar = pod["spec"]["containers"]
    before = original["spec"]["containers"][0]
    # nothing of the controller's own changed: only appended to
    assert {key: value for key, value in manager.items() if key not in ("env", "volumeMounts")} == {
        key: value for key, value in before.items() if key not in ("env", "volumeMounts")
    }
    assert manager["env"][:1] == before["env"]
    assert manager["volumeMounts"][:2] == before["volumeMounts"]
    assert pod["spec"]["volumes"][:2] == original["spec"]["volumes"]
    assert sidecar["name"] == "kuikproxy"
    assert sidecar["image"] == SETTINGS.image
    assert sidecar["resources"] == {
        "requests": {"cpu": "50m", "memory": "192Mi"},
        "limits": {"memory": "192Mi"},
    }


async def test_injecting_the_injected_pod_again_is_a_no_op(webhook: Webhook) -> None:
    """The patched pod sent again (say, reinvoked after another webhook) gets no patch."""
    review = kuik_review()
    first = await webhook.review(review)
    review["request"]["object"] = apply(
        review["request"]["object"], json.loads(base64.b64decode(first["patch"]))
    )
    review["request"]["uid"] = "second"
    again = await webhook.review(review)
    assert again == {"uid": "second", "allowed": True}


async def test_a_pod_without_the_label_is_untouched(webhook: Webhook) -> None:
    """Without kuikproxy.io/inject: "true", the pod is allowed as it is."""
    review = kuik_review()
    del review["request"]["object"]["metadata"]["labels"]["kuikproxy.io/inject"]
    assert await webhook.review(review) == {"uid": review["request"]["uid"], "allowed": True}


async def test_an_unpatchable_pod_is_allowed_with_a_warning(webhook: Webhook) -> None:
    """The webhook never refuses a pod (failurePolicy is the configuration's choice): a pod
    it cannot inject is allowed unchanged, and the warning reaches whoever created it."""
    review = kuik_review()
    review["request"]["object"]["spec"]["hostNetwork"] = True
    response = await webhook.review(review)
    assert "patch" not in response and "patchType" not in response
    assert response["warnings"] == [
        "kuikproxy: sidecar not injected: the pod uses the node's network, "
        "where loopback is the node's"
    ]


def _review_without(*path: str) -> bytes:
    review = kuik_review()
    parent = review
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    return json.dumps(review).encode()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "the body is not JSON"),
        (b"{", "the body is not JSON"),
        (b"\xff\xfe\xfd", "the body is not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "the body is not JSON"),
        (b"[]", "the body is not a JSON object"),
        (
            json.dumps({**kuik_review(), "apiVersion": "admission.k8s.io/v1beta1"}).encode(),
            "expected an AdmissionReview of apiVersion admission.k8s.io/v1",
        ),
        (
            json.dumps({**kuik_review(), "kind": "Pod"}).encode(),
            "expected an AdmissionReview of apiVersion admission.k8s.io/v1",
        ),
        (_review_without("request"), "the AdmissionReview has no request"),
        (_review_without("request", "uid"), "the AdmissionReview's request has no uid"),
    ],
)
async def test_a_malformed_body_is_answered_400_with_the_reason(
    webhook: Webhook, body: bytes, reason: str
) -> None:
    """What cannot be answered as an AdmissionReview is a 400 that says why (the API server
    logs it and applies failurePolicy), never a crash: the webhook serves on."""
    status, answer = await webhook.post(body)
    assert status == 400
    assert answer.decode().startswith(reason)
    assert await webhook.review(kuik_review())


async def test_an_oversized_body_is_refused(webhook: Webhook) -> None:
    """A review is one pod; a body beyond MAX_REVIEW_BYTES is refused before it is parsed."""
    status, _ = await webhook.post(b" " * (MAX_REVIEW_BYTES + 1))
    assert status == 413


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
async def test_probes(webhook: Webhook, path: str) -> None:
    """The kubelet's probes (httpGet, scheme HTTPS), on either path, as `serve` has them."""
    async with webhook.session.get(f"{webhook.url}{path}") as answer:
        assert answer.status == 200
        assert await answer.json() == {"status": "ok"}


async def test_a_renewed_certificate_is_served_without_a_restart(webhook: Webhook) -> None:
    """cert-manager renews the Secret, the kubelet swaps the files: the next handshake shows
    the new certificate (also to a client that sends no server name: 127.0.0.1)."""
    assert webhook.certificate.reload_if_changed() is False
    webhook.authority.issue(webhook.cert_file, webhook.key_file, "renewed")
    assert webhook.certificate.reload_if_changed() is True
    served = await webhook.served_certificate()
    assert served.subject.rfc4514_string() == "CN=renewed"


async def test_a_half_written_pair_keeps_the_current_certificate(webhook: Webhook) -> None:
    """A certificate whose key has not arrived yet is not loaded; the current pair is served
    until both files match, then the new one."""
    webhook.authority.issue(webhook.cert_file, webhook.key_file, "next")
    good_key = webhook.key_file.read_bytes()
    replace(webhook.key_file, stray_key())
    assert webhook.certificate.reload_if_changed() is False
    assert (await webhook.served_certificate()).subject.rfc4514_string() == "CN=first"
    replace(webhook.key_file, good_key)
    assert webhook.certificate.reload_if_changed() is True
    assert (await webhook.served_certificate()).subject.rfc4514_string() == "CN=next"


async def test_the_webhook_is_only_served_over_tls(webhook: Webhook) -> None:
    """Plain HTTP to the port does not get an answer."""
    async with aiohttp.ClientSession() as plain:
        with pytest.raises(aiohttp.ClientError):
            async with plain.get(webhook.url.replace("https", "http") + "/healthz") as answer:
                await answer.read()


def test_certificate_files_that_cannot_load_are_a_usage_error(tmp_path: Path) -> None:
    """Missing files stop the webhook at start with the reason."""
    with pytest.raises(ConfigError) as error:
        ServingCertificate(tmp_path / "tls.crt", tmp_path / "tls.key")
    (line,) = error.value.errors
    assert line.startswith("--tls-cert-file/--tls-key-file: cannot load:")
