"""Addresses kuikproxy never connects to on a registry's say-so (SPEC §3.1).

A host without an explicit ``upstream`` is reached at ``https://<host>``; if its name resolves
to a loopback, link-local or cloud-metadata address (by mistake, by DNS rebinding, or because a
client made up the name), kuikproxy refuses instead of becoming a door into the machine it runs
on. The same goes for the hosts a registry sends it to: token realms and blob redirects. The
endpoints (host and port) of explicit ``upstream`` URLs are trusted as the operator wrote them —
that host's other ports are not, unless the trusted registry itself names them (its token
realm, its redirects).
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
    """Which endpoints may reach any address (those of explicit upstreams), and the check."""

    def __init__(self, trusted: set[Endpoint] | None = None) -> None:
        self.trusted = trusted or set()

    def trust_beside(self, trusted: Endpoint, named: Endpoint) -> None:
        """A trusted registry named another port of its own host (a realm, a redirect)."""
        if trusted in self.trusted and named[0] == trusted[0]:
            self.trusted.add(named)

    def check_literal(self, host: str, port: int) -> None:
        """Refuse a URL whose host is a forbidden IP literal (literals skip the resolver)."""
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return
        if (host, port) not in self.trusted and forbidden(address):
            raise AddressRefused(f"refused to connect to {host}: {_why(address)}")

    def allowed(self, host: str, port: int, results: list[ResolveResult]) -> list[ResolveResult]:
        if (host, port) in self.trusted:
            return results
        kept = [r for r in results if not forbidden(ipaddress.ip_address(r["host"]))]
        if not kept:
            address = ipaddress.ip_address(results[0]["host"]) if results else None
            why = _why(address) if address is not None else "no address"
            raise AddressRefused(f"refused to connect to {host}: {why}")
        return kept


def _why(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    return f"{address} is a loopback, link-local or metadata address"


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, with forbidden addresses taken out of every answer."""

    def __init__(self, guard: AddressGuard) -> None:
        self._guard = guard
        self._resolver = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return self._guard.allowed(host, port, await self._resolver.resolve(host, port, family))

    async def close(self) -> None:
        await self._resolver.close()
