"""Throwaway TLS material for every test that needs some: self-signed CAs, leaves signed by
them for given names, and PEM files written the way the kubelet updates a mounted Secret."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, common_name)])


def key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def cert_der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def _alt_names(ips: Sequence[str], dns: Sequence[str]) -> x509.SubjectAlternativeName:
    return x509.SubjectAlternativeName(
        [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        + [x509.DNSName(host) for host in dns]
    )


def certificate(
    common_name: str,
    key: PrivateKey,
    *,
    issuer: tuple[x509.Certificate, PrivateKey] | None = None,
    ca: bool = False,
    ips: Sequence[str] = (),
    dns: Sequence[str] = (),
    before: datetime.timedelta = datetime.timedelta(minutes=5),
    valid: datetime.timedelta = datetime.timedelta(days=1),
) -> x509.Certificate:
    """A certificate for ``key``, named ``common_name`` and, when given, ``ips`` and ``dns``;
    signed by ``issuer`` (a certificate and its key) or by ``key`` itself; valid from
    ``before`` ago for ``valid``."""
    now = datetime.datetime.now(datetime.UTC)
    signer = key if issuer is None else issuer[1]
    builder = (
        x509.CertificateBuilder()
        .subject_name(name(common_name))
        .issuer_name(name(common_name) if issuer is None else issuer[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - before)
        .not_valid_after(now + valid)
    )
    if ips or dns:
        builder = builder.add_extension(_alt_names(ips, dns), critical=False)
    if ca:
        builder = builder.add_extension(
            x509.BasicConstraints(ca=True, path_length=None), critical=True
        )
    return builder.sign(signer, hashes.SHA256())


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def rsa_key() -> rsa.RSAPrivateKey:
    """An RSA key, for what wants one (RS256 tokens, the way registries' token servers sign)."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key (so no system root trusts it), written
    to ``cert.pem`` and ``key.pem`` in ``directory``."""
    key = new_key()
    cert = certificate("kuikproxy test registry", key, ca=True, ips=["127.0.0.1"])
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert_pem(cert))
    key_path.write_bytes(key_pem(key))
    return cert_path, key_path


class Authority:
    """A CA; :meth:`issue` writes a serving certificate for 127.0.0.1 and its key."""

    def __init__(self, common_name: str = "kuikproxy test CA") -> None:
        self.key = new_key()
        self.cert = certificate(common_name, self.key, ca=True)

    def client_context(self) -> ssl.SSLContext:
        """What the API server does with the caBundle: trust this CA, check the address."""
        return ssl.create_default_context(cadata=cert_pem(self.cert).decode())

    def issue(self, cert_file: Path, key_file: Path, common_name: str) -> x509.Certificate:
        """Write a new pair the way the kubelet updates a mounted Secret: renamed into place."""
        key = new_key()
        cert = certificate(common_name, key, issuer=(self.cert, self.key), ips=["127.0.0.1"])
        replace(cert_file, cert_pem(cert))
        replace(key_file, key_pem(key))
        return cert


def replace(path: Path, data: bytes) -> None:
    """Write ``data`` beside ``path`` and rename it over: a new inode, as the kubelet makes."""
    new = path.with_name(path.name + ".new")
    new.write_bytes(data)
    os.replace(new, path)


def stray_key() -> bytes:
    """A key that matches no certificate: a pair caught half-written."""
    return key_pem(new_key())
