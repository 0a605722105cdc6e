"""Throwaway TLS material for the webhook: a CA (what a MutatingWebhookConfiguration's
``caBundle`` holds) and serving certificates for 127.0.0.1 signed by it."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class Authority:
    """A CA; :meth:`issue` writes a serving certificate for 127.0.0.1 and its key."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name("kuikproxy test CA"))
            .issuer_name(_name("kuikproxy test CA"))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    def client_context(self) -> ssl.SSLContext:
        """What the API server does with the caBundle: trust this CA, check the address."""
        context = ssl.create_default_context(
            cadata=self.cert.public_bytes(serialization.Encoding.PEM).decode()
        )
        return context

    def issue(self, cert_file: Path, key_file: Path, common_name: str) -> x509.Certificate:
        """Write a new pair the way the kubelet updates a mounted Secret: renamed into place."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        replace(cert_file, cert.public_bytes(serialization.Encoding.PEM))
        replace(key_file, _pem(key))
        return cert


def replace(path: Path, data: bytes) -> None:
    """Write ``data`` beside ``path`` and rename it over: a new inode, as the kubelet makes."""
    new = path.with_name(path.name + ".new")
    new.write_bytes(data)
    os.replace(new, path)


def stray_key() -> bytes:
    """A key that matches no certificate: a pair caught half-written."""
    return _pem(ec.generate_private_key(ec.SECP256R1()))
