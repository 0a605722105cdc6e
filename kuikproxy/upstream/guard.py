"""Addresses kuikproxy never connects to on a registry's say-so (SPEC §3.1).

A host without an explicit ``upstream`` is reached at ``https://<host>``; if its name resolves
to a loopback, link-local or cloud-metadata address (by mistake, by DNS rebinding, or because a
client made up the name), kuikproxy refuses instead of becoming a door into the machine it runs
on. The same goes for the hosts a registry sends it to: token realms and blob redirects. The
endpoints (host and port) of explicit ``upstream`` URLs are trusted as the operator wrote them —
that host's other ports are not. A trusted registry may name one for its token realm
(:meth:`AddressGuard.trust_realm`): that endpoint is then reached by token requests only, never
by a redirect (see :mod:`kuikproxy.upstream.registries` for why realms differ).
"""

from __future__ import annotations

import ipaddress
import socket

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

# Cloud metadata services outside the link-local ranges (AWS IPv6, Alibaba Cloud).
_METADATA = frozenset(
    {ipaddress.ip_address("fd00:ec2::254"), ipaddress.ip_address("100.100.100.200")}
)


class AddressRefused(OSError):
    """A connection kuikproxy will not make; the message says where and why."""


def forbidden(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (
        address.is_loopback
        or address.is_link_local
        or address.is_unspecified
        or address.is_multicast
        or address in _METADATA
    )


Endpoint = tuple[str, int]


class AddressGuard:
    """Which endpoints may reach any address, and the check: ``trusted`` are those of explicit
    upstreams, for every request; ``realms`` those trusted registries named for their token
    realm, for token requests only (``realm=True``)."""

    def __init__(self, trusted: set[Endpoint] | None = None) -> None:
        self.trusted = trusted or set()
        self.realms: set[Endpoint] = set()

    def configure(self, trusted: set[Endpoint]) -> None:
        """The endpoints of a new configuration: realms named under the old one are forgotten
        (their registry may no longer be trusted)."""
        self.trusted = trusted
        self.realms = set()

    def trust_realm(self, registry: Endpoint, realm: Endpoint) -> None:
        """A trusted registry named another port of its own host for its token realm."""
        if registry in self.trusted and realm[0] == registry[0]:
            self.realms.add(realm)

    def _trusts(self, host: str, port: int, realm: bool) -> bool:
        return (host, port) in self.trusted or (realm and (host, port) in self.realms)

    def check_literal(self, host: str, port: int, *, realm: bool = False) -> None:
        """Refuse a URL whose host is a forbidden IP literal (literals skip the resolver),
        legacy numeric forms included (``2130706433``, ``127.1``: the socket library reads them
        as addresses)."""
        address = _literal(host)
        if address is not None and not self._trusts(host, port, realm) and forbidden(address):
            raise AddressRefused(f"refused to connect to {host}: {_why(address)}")

    def allowed(
        self, host: str, port: int, results: list[ResolveResult], *, realm: bool = False
    ) -> list[ResolveResult]:
        if self._trusts(host, port, realm):
            return results
        kept = [r for r in results if not forbidden(ipaddress.ip_address(r["host"]))]
        if not kept:
            address = ipaddress.ip_address(results[0]["host"]) if results else None
            why = _why(address) if address is not None else "no address"
            raise AddressRefused(f"refused to connect to {host}: {why}")
        return kept


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def _why(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    return f"{address} is a loopback, link-local or metadata address"


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, with forbidden addresses taken out of every answer; ``realm``: the
    resolver of the connections token requests use (:attr:`AddressGuard.realms` trusted)."""

    def __init__(self, guard: AddressGuard, *, realm: bool = False) -> None:
        self._guard = guard
        self._realm = realm
        self._resolver = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._resolver.resolve(host, port, family)
        return self._guard.allowed(host, port, results, realm=self._realm)

    async def close(self) -> None:
        await self._resolver.close()
