"""``kuikproxy ca bundle``: the PEM bundle intercepted clients trust (SPEC §13).

A client behind kuikproxy's forward proxy sees kuikproxy's leaf certificates for the registries
it reads, and the real certificates of everything else it reaches directly (``NO_PROXY``). Its
``SSL_CERT_FILE`` must therefore hold both: the system's roots, then kuikproxy's CA. The roots
are the file OpenSSL itself would read (``ssl.get_default_verify_paths``).
"""

from __future__ import annotations

import ssl
from pathlib import Path

from kuikproxy.forward.authority import Authority, CertificateError


def system_roots() -> bytes:
    """The system's CA bundle, as OpenSSL finds it."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate and Path(candidate).is_file():
            return Path(candidate).read_bytes()
    raise CertificateError(
        "no system CA bundle found (install ca-certificates, or set SSL_CERT_FILE to one)"
    )


def bundle(authority: Authority) -> bytes:
    roots = system_roots()
    separator = b"" if roots.endswith(b"\n") else b"\n"
    return roots + separator + b"# kuikproxy interception CA\n" + authority.pem
