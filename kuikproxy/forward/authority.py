"""The interception CA (SPEC §13): kuikproxy's own certificate authority and the leaf
certificates it mints from it, one per host a client ``CONNECT``s to.

The CA is the operator's (``forwardProxy.ca.certFile``/``keyFile``) or, when neither file
exists, generated on first start and written with mode 0600 — clients trust it through
``kuikproxy ca bundle``. Leaves are ECDSA P-256 (cheap to mint: a new host costs about a
millisecond), valid :data:`LEAF_LIFETIME` from an hour ago, re-minted once less than
:data:`RENEW_BEFORE` is left, and kept for the :data:`LEAVES` most recent hosts.

Every intercepted pod trusts this CA for every name, so a leaf is presented for the host a
client's ``CONNECT`` names and for no other: a ClientHello whose SNI names another host ends
the handshake (:func:`_only`). Were the leaf minted for whatever the SNI asks, any client of the
proxy could have kuikproxy sign a certificate for any name — ``kubernetes.default.svc``, a
bank — that the other pods would accept.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import os
import ssl
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kuikproxy.errors import KuikProxyError

CA_LIFETIME = dt.timedelta(days=3650)
LEAF_LIFETIME = dt.timedelta(days=7)
RENEW_BEFORE = dt.timedelta(days=1)
BACKDATE = dt.timedelta(hours=1)  # clocks of clients a little behind still accept a new leaf
LEAVES = 1024

log = logging.getLogger(__name__)


CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    key_cert_sign=True,
    crl_sign=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    encipher_only=False,
    decipher_only=False,
)


class CertificateError(KuikProxyError):
    """The interception CA cannot be loaded or written."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kuikproxy"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64]),
        ]
    )


def _normal(name: str) -> str:
    """A host name as TLS compares it: without case or a trailing dot."""
    return name.lower().rstrip(".")


SNICallback = Callable[[ssl.SSLObject, str | None, ssl.SSLContext], int | None]


def _only(host: str) -> SNICallback:
    """The SNI check of a context presenting ``host``'s leaf: a ClientHello that names no
    host (as for an IP address) or ``host`` goes on; one naming any other host gets an
    ``unrecognized_name`` alert, before a certificate is sent."""

    def check(_: ssl.SSLObject, name: str | None, __: ssl.SSLContext) -> int | None:
        if name is None or _normal(name) == host:
            return None
        # the handshake then fails as "callback failed": say which names disagreed
        log.debug("TLS for %r refused in a CONNECT to %s", name[:300], host)
        return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME

    return check


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` readable by its owner only, from the first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)


def create_ca(cert_file: Path, key_file: Path) -> None:
    """A new CA, its certificate and key written with mode 0600."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("kuikproxy interception CA")
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(CA_KEY_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(
        key_file,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    _write_private(cert_file, cert.public_bytes(serialization.Encoding.PEM))


class Authority:
    """Mints and keeps the leaf certificates kuikproxy presents to intercepted clients."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        cert_path, key_path = Path(cert_file), Path(key_file)
        if not cert_path.exists() and not key_path.exists():
            create_ca(cert_path, key_path)
        try:
            self.pem = cert_path.read_bytes()
            self.cert = x509.load_pem_x509_certificate(self.pem)
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as error:
            raise CertificateError(
                f"forwardProxy.ca: cannot load {cert_file} and {key_file}: {error}"
            ) from None
        if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise CertificateError(f"forwardProxy.ca.keyFile: {key_file} is not an EC or RSA key")
        self._key = key
        self._leaves: OrderedDict[str, tuple[ssl.SSLContext, dt.datetime]] = OrderedDict()
        # one key for every leaf: a leaf's key never leaves the process, and minting is then
        # a signature, not a key generation
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._dir: str | None = None  # made at the first leaf, mode 0700

    def context(self, host: str) -> ssl.SSLContext:
        """A server-side TLS context presenting a leaf for ``host`` (a name or an address,
        without brackets), and refusing a ClientHello that names another host."""
        host = _normal(host)
        kept = self._leaves.get(host)
        if kept is not None and kept[1] - _now() > RENEW_BEFORE:
            self._leaves.move_to_end(host)
            return kept[0]
        context, expires = self._mint(host)
        self._leaves[host] = (context, expires)
        self._leaves.move_to_end(host)
        while len(self._leaves) > LEAVES:
            self._leaves.popitem(last=False)
        return context

    def _mint(self, host: str) -> tuple[ssl.SSLContext, dt.datetime]:
        now = _now()
        expires = now + LEAF_LIFETIME
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(host))
            .issuer_name(self.cert.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(expires)
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        # ssl loads certificates from files only: written to a private directory, loaded,
        # and removed at once
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="kuikproxy-leaves-")
        chain = cert.public_bytes(serialization.Encoding.PEM) + self.pem
        key = self._leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        with tempfile.NamedTemporaryFile(dir=self._dir) as cert_file:
            cert_file.write(chain)
            cert_file.flush()
            with tempfile.NamedTemporaryFile(dir=self._dir) as key_file:
                key_file.write(key)
                key_file.flush()
                context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                context.load_cert_chain(cert_file.name, key_file.name)
        context.sni_callback = _only(host)
        return context, expires

    def close(self) -> None:
        if self._dir is not None:
            os.rmdir(self._dir)
            self._dir = None
