"""From an HTTP request to a classified registry read (SPEC §3, §4): which host, which image,
which resource, which operation — or the OCI error that says why it is none of these.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import parse_qsl, urlencode

from multidict import CIMultiDictProxy

from kuikproxy.config import Config, validate_host
from kuikproxy.core.images import (
    BLOBS,
    MANIFESTS,
    REFERRERS,
    TAGS,
    Image,
    check_digest,
    check_reference,
    parse_repository,
)
from kuikproxy.core.tickets import Operation
from kuikproxy.errors import Ambiguous, Denied, NameInvalid, NameUnknown, NotFound
from kuikproxy.runtime.flowgate import FlowGate
from kuikproxy.runtime.messages import KUIK_OPERATION, RegistryRequest

_MAX_RESOURCE = 253


@dataclass(frozen=True, slots=True)
class ParsedPath:
    """A parsed ``/v2/`` path: ``kind`` is ``ping``, ``manifests``, ``blobs``, or ``raw`` (a
    write's path, passed through as it is: ``repository`` holds all of it after ``/v2/``)."""

    kind: str
    repository: str = ""
    reference: str = ""


def parse_route(raw_path: str) -> ParsedPath:
    """Split ``/v2/<name>/(manifests|blobs)/<reference>``; the name is validated later, once
    the host (and so Docker Hub's ``library/``) is known."""
    if raw_path in ("/v2", "/v2/"):
        return ParsedPath("ping")
    if not raw_path.startswith("/v2/"):
        raise NotFound(f"no such route {raw_path[:200]!r}")
    rest = raw_path[len("/v2/") :]
    name, marker, _ = rest.rpartition("/tags/list")
    if marker and rest.endswith(marker) and name:
        return ParsedPath(TAGS, name, "list")
    for kind in (MANIFESTS, BLOBS, REFERRERS):
        name, marker, reference = rest.rpartition(f"/{kind}/")
        if marker:
            if not name or not reference or "/" in reference:
                raise NameUnknown(f"invalid path {raw_path[:200]!r}")
            return ParsedPath(kind, name, reference)
    raise NotFound(f"kuikproxy does not serve {raw_path[:200]!r}")


def parse_raw_route(raw_path: str) -> ParsedPath:
    """A write's path (uploads, manifest PUTs, deletes): checked for traversal, not parsed."""
    if not raw_path.startswith("/v2/"):
        raise NotFound(f"no such route {raw_path[:200]!r}")
    rest = raw_path[len("/v2/") :]
    if any(segment in ("", ".", "..") for segment in rest.rstrip("/").split("/")):
        raise NameInvalid(f"invalid path {raw_path[:200]!r}")
    return ParsedPath("raw", rest)


Query = Sequence[tuple[str, str]]


def parse_query(raw: str) -> list[tuple[str, str]]:
    """``parse_qsl`` with blank values kept, and a fast path for what registry clients send
    (``ns=docker.io``, nothing to unquote): this runs for every request."""
    if not raw:
        return []
    if "%" in raw or "+" in raw:
        return parse_qsl(raw, keep_blank_values=True)
    return [(k, v) for k, _, v in (pair.partition("=") for pair in raw.split("&") if pair)]


# kuik v1 spells a registry's port with a dash in path prefixes: ``reg.local-5000``.
_DASH_PORT = re.compile(r"(?P<host>.+)-(?P<port>[0-9]{1,5})")


@dataclass(frozen=True, slots=True)
class Target:
    """Where a request goes: the host, the route with the host's prefix taken off the name,
    and whether the host came from ``?ns=`` (the answer then says ``OCI-Namespace``)."""

    host: str
    route: ParsedPath
    by_ns: bool
    prefix: str | None = None  # the path segment that named the host, as the client wrote it
    by_default: bool = False  # nothing named the host: it is defaultRegistry


def locate(route: ParsedPath, query: Query, host_header: str, config: Config) -> Target:
    """The registry host a request is for (SPEC §3), in order: ``?ns=`` (containerd), a path
    prefix (``/v2/<host>/<repository>/...``), the ``Host`` header through ``hostAliases``, and
    ``defaultRegistry``. A host that is not allowed (§3.1) is refused before anything else."""
    ns = _ns(query)
    first, slash, rest = route.repository.partition("/")
    prefixed = bool(slash) and _names_a_host(first)
    if ns is not None:
        host = _allowed(ns, config)
        if not prefixed:
            return Target(host, route, by_ns=True)
        named = _prefix_host(first, config)
        if named != host:
            raise _ambiguous(host, named, "the path names")
        return Target(host, ParsedPath(route.kind, rest, route.reference), by_ns=True, prefix=first)
    if prefixed:
        host = _prefix_host(first, config)
        return Target(
            host, ParsedPath(route.kind, rest, route.reference), by_ns=False, prefix=first
        )
    alias = config.host_aliases.get(host_header.lower())
    if alias is None:
        alias = config.host_aliases.get(host_header.lower().rpartition(":")[0])
    host = _allowed(alias or config.default_registry, config)
    return Target(host, route, by_ns=False, by_default=alias is None)


def _ns(query: Query) -> str | None:
    """The host ``?ns=`` names, if any; every ``ns`` must name the same one (a forward
    proxy's target arrives as one too)."""
    hosts: list[str] = []
    for key, value in query:
        if key != "ns":
            continue
        try:
            host = validate_host(value)
        except ValueError as e:
            raise Denied(
                f"invalid ns {value[:200]!r}", detail={"ns": value[:200]}, refusal="notAllowed"
            ) from e
        if hosts and host != hosts[0]:
            raise _ambiguous(hosts[0], host, "another ns names")
        hosts.append(host)
    return hosts[0] if hosts else None


def _ambiguous(host: str, other: str, how: str) -> Ambiguous:
    return Ambiguous(
        f"ambiguous registry: ns names {host} but {how} {other}",
        detail={"hosts": [host, other]},
        refusal="ambiguous",
    )


def _names_a_host(segment: str) -> bool:
    """Docker's reference grammar: a first component with a ``.`` or ``:``, or ``localhost``,
    is a registry host, never part of a repository name."""
    return "." in segment or ":" in segment or segment == "localhost"


def _prefix_host(segment: str, config: Config) -> str:
    """The host a path prefix names; ``reg.local-5000`` may mean ``reg.local:5000`` (kuik v1).
    A prefix that cannot be a host (``..``) makes the whole name malformed: no such repository
    can exist (404, as for any malformed name on a read)."""
    try:
        host = validate_host(segment)
    except ValueError as e:
        raise NameUnknown(f"invalid registry host {segment[:200]!r} in the path") from e
    dashed = _DASH_PORT.fullmatch(segment) if ":" not in segment else None
    if dashed is not None and int(dashed["port"]) <= 65535:
        with_port = validate_host(f"{dashed['host']}:{dashed['port']}")
        if config.is_allowed(with_port) or not config.is_allowed(host):
            return _allowed(with_port, config)
    return _allowed(host, config)


def _allowed(host: str, config: Config) -> str:
    if not config.is_allowed(host):
        raise Denied(f"host {host} is not allowed", detail={"host": host}, refusal="notAllowed")
    return host


def resource_of(
    headers: Mapping[str, str],
    remote: str | None,
    config: Config,
    proxy_authorization: str | None = None,
) -> str:
    """Who a request with ``headers``, from the address ``remote``, is for (§4.2): the first
    configured source that names it. ``proxy_authorization`` is the one the client sent on its
    ``CONNECT``, for a request that came through an intercepted tunnel (§13)."""
    for source in config.resource_identity:
        if source.startswith("header:"):
            name = _printable(headers.get(source[len("header:") :], ""))
        elif source == "proxyUser":
            sent = headers.get("Proxy-Authorization") or proxy_authorization or ""
            name = _printable(_proxy_user(sent))
        else:
            name = remote or "unknown"
        if name:
            return name
    return remote or "unknown"


def _proxy_user(value: str) -> str:
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "basic":
        return ""
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return ""
    return decoded.partition(":")[0]


def _printable(value: str) -> str:
    value = value.strip()
    if len(value) > _MAX_RESOURCE or not value.isprintable():
        return ""
    return value


def auth_key(headers: Mapping[str, str]) -> str | None:
    """A key of the client's own ``Authorization`` (R5): equal keys, equal credentials; the
    credential itself is never kept."""
    value = headers.get("Authorization")
    if value is None:
        return None
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Located:
    """What a request's line says: where it goes, its query, and (for a read) its image."""

    target: Target
    query: tuple[tuple[str, str], ...]
    image: Image | None


class Locator:
    """Where requests go (§3) and what they read, remembered per request line and ``Host``:
    clients ask for the same images again and again, and parsing and validating a line costs
    more than the rest of a kept answer's path. Bounded; refusals are not remembered (each
    raises again), so no client can fill it with anything but lines that parse."""

    def __init__(self, config: Config, size: int = 8192) -> None:
        self._config = config
        self.locate = lru_cache(maxsize=size)(self._locate)
        # most lines' queries are alike (``ns=<registry>``): parsed once and shared, so that a
        # remembered line (and a held request's) holds no copy of its own (~220 B each)
        self._query = lru_cache(maxsize=_QUERIES)(_parsed_query)

    def _locate(self, raw_path: str, raw_query: str, host_header: str, write: bool) -> Located:
        query = self._query(raw_query)
        route = parse_raw_route(raw_path) if write else parse_route(raw_path)
        target = locate(route, query, host_header, self._config)
        read = not write and target.route.kind != "ping"
        image = image_of(target.host, target.route, query) if read else None
        return Located(target, query, image)


_QUERIES = 256  # distinct query strings remembered by a Locator


def _parsed_query(raw: str) -> tuple[tuple[str, str], ...]:
    return tuple(parse_query(raw))


def image_of(host: str, route: ParsedPath, query: Query) -> Image:
    """The image a read names, every part validated (§12)."""
    repository = parse_repository(route.repository, host)
    if route.kind == BLOBS:
        return Image(host, repository, check_digest(route.reference), BLOBS)
    if route.kind in (TAGS, REFERRERS):  # paced on the check series (§4.1)
        reference = route.reference if route.kind == TAGS else check_digest(route.reference)
        pages = urlencode(sorted((k, v) for k, v in query if k != "ns"))
        return Image(host, repository, reference, route.kind, pages)
    return Image(host, repository, check_reference(route.reference))


def classify(
    method: str,
    headers: CIMultiDictProxy[str],
    remote: str | None,
    image: Image,
    *,
    query: tuple[tuple[str, str], ...],
    config: Config,
    flows: FlowGate,
    paced: bool = True,
    proxy_authorization: str | None = None,
    signer: str | None = None,
) -> RegistryRequest:
    """A manifest, blob, tag list or referrers read as the runtime paces it (§4.1, §4.3), from
    the request's ``method``, ``headers`` and peer address ``remote`` (a request aiohttp made,
    or a message the fast path reads, :mod:`kuikproxy.web.fastpath`); its priority level and
    flow (§10) are found by ``flows`` when first needed. ``signer`` is the fingerprint of
    kuikproxy's own credentials for the host, if it holds any (R5)."""
    if image.route == BLOBS:
        operation, opens = Operation.COPY, False
    elif image.route in (TAGS, REFERRERS):
        operation, opens = Operation.CHECK, False
    else:
        as_check = headers.get(KUIK_OPERATION, "").lower() == "check"
        if method == "HEAD" or as_check:
            operation, opens = Operation.CHECK, False
        else:
            operation, opens = Operation.COPY, not image.by_digest
    return RegistryRequest(
        host=image.host,
        image=image,
        resource=resource_of(headers, remote, config, proxy_authorization),
        operation=operation,
        method=method,
        opens=opens,
        sent=headers,
        auth=auth_key(headers),
        accept=tuple(headers.getall("Accept", ())),
        gate=flows,
        query=tuple((k, v) for k, v in query if k != "ns"),
        paced=paced,
        signer=signer,
    )
