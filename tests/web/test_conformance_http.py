"""The OCI distribution-spec conformance suite's read expectations hold through kuikproxy.

The suite (opencontainers/distribution-spec ``conformance/`` at
13a5d3e) was run by hand through kuikproxy in front of Debian's ``docker-registry``; how, and
its results, are in ``docs/conformance.md``. Each case of the table below pins one read
expectation of its *pull* workflow (``01_pull_test.go``), plus the tag-list reads of its content
discovery workflow (``03_discovery_test.go``, which kuikproxy paces on the check series) and the
edges of SPEC §12 the suite only touches once (the tag grammar, malformed repository names).
A case's ``spec`` is the suite's own ``Context / Specify`` text, or ``SPEC §…`` for an
expectation beyond the suite.

The requests are the suite's: bare paths on ``defaultRegistry`` (the hand run's
``OCI_ROOT_URL`` pointed at kuikproxy), repository ``conformance/pull`` (``OCI_NAMESPACE``), tag
``tagtest0`` (``OCI_TAG_NAME``), ``dummyDigest`` (sha256 of ``hello world``) for the blob no
registry has, ``.INVALID_MANIFEST_NAME`` for the manifest no registry has and
``sha256:totallywrong`` for the error-code spec. Every case checks the status, the OCI error
body of a refusal or relayed error (``{"errors": [{"code", "message", "detail"?}]}`` with a
code from the suite's list), ``Docker-Content-Digest`` and ``Content-Length`` where the suite
or the spec reads them, and whether the recording registry saw the request: kuikproxy answers
malformed references itself (§12: none of them reaches the registry), and relays the rest
after their window.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import pytest
from aiohttp.test_utils import TestServer

from tests.conftest import ProxyFactory
from tests.upstream_app import BLOB_SIZE, Registry, blob_digest, digest_of, manifest_of

pytestmark = pytest.mark.looptime

TOP = "defaultRegistry: registry.test"
HOST_BLOCK = "check: {interval: 200ms}\ncopy: {interval: 200ms, idle: 1s}"
INTERVAL = 0.2

NS = "conformance/pull"  # OCI_NAMESPACE
TAG = "tagtest0"  # OCI_TAG_NAME (the suite's testTagName)
MISSING_TAG = "nosuchtag"  # well-formed, not in the registry
DUMMY = "sha256:b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"  # dummyDigest
NONEXISTENT_MANIFEST = ".INVALID_MANIFEST_NAME"  # the suite's nonexistentManifest
LISTED_TAGS = ["tagtest0", "alpha", "gamma", "beta"]  # OCI_TAG_LIST, in push order

# setup.go's errorCodes: the codes an OCI error body may carry.
OCI_CODES = {
    "BLOB_UNKNOWN",
    "BLOB_UPLOAD_INVALID",
    "BLOB_UPLOAD_UNKNOWN",
    "DIGEST_INVALID",
    "MANIFEST_BLOB_UNKNOWN",
    "MANIFEST_INVALID",
    "MANIFEST_UNKNOWN",
    "MANIFEST_UNVERIFIED",
    "NAME_INVALID",
    "NAME_UNKNOWN",
    "SIZE_INVALID",
    "TAG_INVALID",
    "UNAUTHORIZED",
    "DENIED",
    "UNSUPPORTED",
}


@dataclass(frozen=True)
class Content:
    """What the registry holds, as the pull workflow's setup (or ``OCI_*`` variables) has it:
    manifest[0] under ``TAG``, manifest[1] pushed by digest, config[0] as a blob."""

    manifest0: bytes
    manifest1: bytes
    blob: str

    def fill(self, text: str) -> str:
        return text.format(
            ns=NS,
            tag=TAG,
            dummy=DUMMY,
            blob=self.blob,
            manifest0=digest_of(self.manifest0),
            manifest1=digest_of(self.manifest1),
        )

    def size(self, name: str) -> int:
        return {"manifest0": len(self.manifest0), "manifest1": len(self.manifest1)}.get(
            name, BLOB_SIZE
        )


@dataclass(frozen=True)
class Case:
    """One read and what the suite (``spec``) expects of it through kuikproxy.

    ``path`` has ``{ns}``, ``{tag}``, ``{dummy}``, ``{blob}``, ``{manifest0}``, ``{manifest1}``
    filled in; ``code`` is the OCI error code of the answer (read from the body on GETs);
    ``detail`` a ``detail`` the registry sent that must come back as it was (a relayed error,
    not one kuikproxy made); ``digest`` names the expected ``Docker-Content-Digest``
    (``manifest0``, ``manifest1``, ``blob``); ``length`` the expected ``Content-Length`` (the
    size of that content) on a HEAD; ``body`` that a GET returns that content whole;
    ``reaches`` whether the registry sees the request (after a window, unless it is the ping);
    ``tags`` the tag list a ``tags/list`` GET returns; ``headers`` and ``data`` are sent as the
    suite sends them."""

    id: str
    spec: str
    method: str
    path: str
    status: int
    code: str | None = None
    detail: object = None
    digest: str | None = None
    length: bool = False
    body: bool = False
    reaches: bool = True
    tags: list[str] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    data: bytes | None = None


MANIFEST = "application/vnd.oci.image.manifest.v1+json"
ACCEPT = {"Accept": MANIFEST}

CASES = [
    # --- 01_pull_test.go, "Pull blobs" ---------------------------------------------------
    Case(
        "pull-blobs-head-nonexistent-404",
        "Pull / Pull blobs / HEAD request to nonexistent blob should result in 404 response",
        "HEAD",
        "/v2/{ns}/blobs/{dummy}",
        404,
    ),
    Case(
        "pull-blobs-head-existing-200",
        "Pull / Pull blobs / HEAD request to existing blob should yield 200",
        "HEAD",
        "/v2/{ns}/blobs/{blob}",
        200,
        digest="blob",
        length=True,
    ),
    Case(
        "pull-blobs-get-nonexistent-404",
        "Pull / Pull blobs / GET nonexistent blob should result in 404 response",
        "GET",
        "/v2/{ns}/blobs/{dummy}",
        404,
        code="BLOB_UNKNOWN",
    ),
    Case(
        "pull-blobs-get-existing-200",
        "Pull / Pull blobs / GET request to existing blob URL should yield 200",
        "GET",
        "/v2/{ns}/blobs/{blob}",
        200,
        digest="blob",
        body=True,
    ),
    # --- 01_pull_test.go, "Pull manifests" -----------------------------------------------
    Case(
        "pull-manifests-head-nonexistent-404",
        "Pull / Pull manifests / HEAD request to nonexistent manifest should return 404",
        "HEAD",
        f"/v2/{{ns}}/manifests/{NONEXISTENT_MANIFEST}",
        404,
        reaches=False,
    ),
    Case(
        "pull-manifests-head-manifest0-digest-200",
        "Pull / Pull manifests / HEAD request to manifest[0] path (digest) should yield 200",
        "HEAD",
        "/v2/{ns}/manifests/{manifest0}",
        200,
        digest="manifest0",
        length=True,
        headers=ACCEPT,
    ),
    Case(
        "pull-manifests-head-manifest1-digest-200",
        "Pull / Pull manifests / HEAD request to manifest[1] path (digest) should yield 200",
        "HEAD",
        "/v2/{ns}/manifests/{manifest1}",
        200,
        digest="manifest1",
        length=True,
        headers=ACCEPT,
    ),
    Case(
        "pull-manifests-head-tag-200",
        "Pull / Pull manifests / HEAD request to manifest path (tag) should yield 200 response",
        "HEAD",
        "/v2/{ns}/manifests/{tag}",
        200,
        digest="manifest0",
        length=True,
        headers=ACCEPT,
    ),
    Case(
        "pull-manifests-get-nonexistent-404",
        "Pull / Pull manifests / GET nonexistent manifest should return 404",
        "GET",
        f"/v2/{{ns}}/manifests/{NONEXISTENT_MANIFEST}",
        404,
        code="MANIFEST_UNKNOWN",
        reaches=False,
    ),
    Case(
        "pull-manifests-get-manifest0-digest-200",
        "Pull / Pull manifests / GET request to manifest[0] path (digest) should yield 200",
        "GET",
        "/v2/{ns}/manifests/{manifest0}",
        200,
        digest="manifest0",
        body=True,
        headers=ACCEPT,
    ),
    Case(
        "pull-manifests-get-manifest1-digest-200",
        "Pull / Pull manifests / GET request to manifest[1] path (digest) should yield 200",
        "GET",
        "/v2/{ns}/manifests/{manifest1}",
        200,
        digest="manifest1",
        body=True,
        headers=ACCEPT,
    ),
    Case(
        "pull-manifests-get-tag-200",
        "Pull / Pull manifests / GET request to manifest path (tag) should yield 200 response",
        "GET",
        "/v2/{ns}/manifests/{tag}",
        200,
        digest="manifest0",
        body=True,
        headers=ACCEPT,
    ),
    # --- 01_pull_test.go, "Error codes" --------------------------------------------------
    Case(
        "pull-error-codes-400-oci-body",
        "Pull / Error codes / 400 response body should contain OCI-conforming JSON message",
        "GET",
        "/v2/{ns}/manifests/sha256:totallywrong",
        400,
        code="DIGEST_INVALID",
        reaches=False,
        headers={"Content-Type": MANIFEST},
        data=b"blablabla",  # invalidManifestContent, sent with the GET as the suite does
    ),
    # --- unknown tag: the registry's 404 relayed, its OCI body as it was -----------------
    Case(
        "unknown-tag-get-404-relayed",
        "SPEC §12 (relayed), as Pull / Pull manifests / GET nonexistent manifest",
        "GET",
        f"/v2/{{ns}}/manifests/{MISSING_TAG}",
        404,
        code="MANIFEST_UNKNOWN",
        detail={"Tag": MISSING_TAG},
    ),
    Case(
        "unknown-tag-head-404-relayed",
        "SPEC §12 (relayed), as Pull / Pull manifests / HEAD request to nonexistent manifest",
        "HEAD",
        f"/v2/{{ns}}/manifests/{MISSING_TAG}",
        404,
    ),
    # --- the tag grammar: malformed tags are 404 MANIFEST_UNKNOWN, never read ------------
    Case(
        "tag-129-chars-404",
        "SPEC §12 tag grammar (a tag is at most 128 characters)",
        "GET",
        f"/v2/{{ns}}/manifests/{'a' * 129}",
        404,
        code="MANIFEST_UNKNOWN",
        reaches=False,
    ),
    Case(
        "tag-128-chars-read",
        "SPEC §12 tag grammar (128 characters is a tag: read)",
        "HEAD",
        f"/v2/{{ns}}/manifests/{'a' * 128}",
        200,
    ),
    Case(
        "tag-leading-dash-404",
        "SPEC §12 tag grammar (a tag starts with [A-Za-z0-9_])",
        "GET",
        "/v2/{ns}/manifests/-tagtest0",
        404,
        code="MANIFEST_UNKNOWN",
        reaches=False,
    ),
    Case(
        "tag-leading-dot-head-404",
        "SPEC §12 tag grammar; the suite's nonexistentManifest on a HEAD",
        "HEAD",
        "/v2/{ns}/manifests/.tagtest0",
        404,
        reaches=False,
    ),
    # --- malformed repository names are 404 NAME_UNKNOWN, never read ---------------------
    Case(
        "name-uppercase-404",
        "SPEC §12 repository grammar (lowercase components)",
        "GET",
        "/v2/Conformance/pull/manifests/{tag}",
        404,
        code="NAME_UNKNOWN",
        reaches=False,
    ),
    Case(
        "name-trailing-separator-404",
        "SPEC §12 repository grammar (a component ends in [a-z0-9])",
        "GET",
        "/v2/conformance/pull-/manifests/{tag}",
        404,
        code="NAME_UNKNOWN",
        reaches=False,
    ),
    Case(
        "name-malformed-blob-404",
        "SPEC §12 repository grammar, on a blob read",
        "GET",
        "/v2/conformance/-pull/blobs/{blob}",
        404,
        code="NAME_UNKNOWN",
        reaches=False,
    ),
    Case(
        "malformed-blob-digest-400",
        "SPEC §12 digest grammar, as Pull / Error codes on a blob",
        "GET",
        "/v2/{ns}/blobs/sha256:totallywrong",
        400,
        code="DIGEST_INVALID",
        reaches=False,
    ),
    # --- the ping --------------------------------------------------------------------------
    Case(
        "ping-200",
        "distribution-spec end-1 (GET /v2/: 200, or 401 with a challenge); unpaced, §4.1",
        "GET",
        "/v2/",
        200,
    ),
    # --- 03_discovery_test.go, "listing tags": paced on the check series, n/last passed --
    Case(
        "discovery-tags-list-200-sorted",
        "Content Discovery / listing tags / GET request to list tags should yield 200 response"
        " and be in sorted order",
        "GET",
        "/v2/{ns}/tags/list",
        200,
        tags=sorted(LISTED_TAGS),
    ),
    Case(
        "discovery-tags-list-n",
        "Content Discovery / listing tags / GET number of tags should be limitable by `n`",
        "GET",
        "/v2/{ns}/tags/list?n=2",
        200,
        tags=["alpha", "beta"],
    ),
    Case(
        "discovery-tags-list-last",
        "Content Discovery / listing tags / GET start of tag is set by `last` query parameter",
        "GET",
        "/v2/{ns}/tags/list?n=2&last=beta",
        200,
        tags=["gamma", "tagtest0"],
    ),
    Case(
        "discovery-tags-list-unknown-name-404",
        "SPEC §12 (relayed): a tag list of a repository the registry lacks",
        "GET",
        "/v2/conformance/other/tags/list",
        404,
        code="NAME_UNKNOWN",
    ),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
async def test_conformance_read(
    case: Case, registry: tuple[Registry, TestServer], proxy: ProxyFactory
) -> None:
    """The read of ``case.spec`` gets through kuikproxy what the conformance suite expects."""
    fake, _ = registry
    fake.unknown_tags.add(MISSING_TAG)
    fake.tags[NS] = list(LISTED_TAGS)
    content = Content(manifest_of(NS, TAG), manifest_of(NS, "pushed-by-digest"), blob_digest("c"))
    client = await proxy(HOST_BLOCK, top=TOP)
    path = content.fill(case.path)

    start = asyncio.get_running_loop().time()
    response = await client.request(case.method, path, headers=case.headers, data=case.data)
    raw = await response.read()

    assert response.status == case.status, raw[:300]
    if case.code is not None:
        assert response.content_type == "application/json"
        errors = json.loads(raw)["errors"]
        assert errors, raw
        assert all({"code", "message"} <= e.keys() <= {"code", "message", "detail"} for e in errors)
        assert errors[0]["code"] == case.code
        assert errors[0]["code"] in OCI_CODES
        if case.detail is not None:
            assert errors[0]["detail"] == case.detail, "the registry's error body, relayed"
    if case.method == "HEAD":
        assert raw == b""

    if case.digest is not None:
        want = content.fill("{" + case.digest + "}")
        assert response.headers["Docker-Content-Digest"] == want
        if case.length:
            assert response.headers["Content-Length"] == str(content.size(case.digest))
        if case.body:
            assert digest_of(raw) == want, "the content whole"
    if case.tags is not None:
        listed = json.loads(raw)
        assert listed == {"name": NS, "tags": case.tags}

    upstream_path = path.split("?")[0]
    seen = [s for s in fake.seen if s.path == upstream_path]
    if not case.reaches:
        assert seen == [], "kuikproxy answers this itself (§12)"
        assert [s.path for s in fake.seen if s.path != "/v2/"] == []
    else:
        assert [s.method for s in seen] == [case.method]
        if path != "/v2/":
            assert seen[0].at - start >= INTERVAL - 1e-6, "read at a window, not before"
