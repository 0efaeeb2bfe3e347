"""A throwaway certificate authority and server certificate for TLS tests.

Tests verify certificates for real (no ``verify=False``): a client that skips verification
would also pass against a server presenting the wrong certificate. Generation takes a few
milliseconds with EC keys; a session-scoped fixture calls :func:`generate_tls_files` once
and shares the result.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["SERVER_NAMES", "TlsFiles", "client_ssl_context", "generate_tls_files"]

#: The names the server certificate is valid for.
SERVER_NAMES: Final = ("localhost", "127.0.0.1", "::1")

# Backdated a little so a client clock slightly behind ours still accepts it.
_BACKDATE: Final = timedelta(minutes=5)
_VALIDITY: Final = timedelta(days=7)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files: the server's certificate and key, and the CA that signed it."""

    cert: Path
    key: Path
    ca: Path


def generate_tls_files(directory: Path) -> TlsFiles:
    """Create a fresh CA and a server certificate for :data:`SERVER_NAMES` in ``directory``.

    The certificates carry the extensions ``VERIFY_X509_STRICT`` insists on (key
    identifiers, critical basic constraints), so they keep working as Python's
    default client context grows stricter.
    """
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ASBP test CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(key_cert_sign=True), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVER_NAMES[0])]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.SubjectAlternativeName(_general_names()), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(key_cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    files = TlsFiles(
        cert=directory / "server.pem", key=directory / "server.key", ca=directory / "ca.pem"
    )
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    key_pem = server_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # Created owner-only from the start: a private key should never be world-readable,
    # even a throwaway one.
    fd = os.open(files.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "wb") as key_file:
        key_file.write(key_pem)
    return files


def client_ssl_context(
    tls: TlsFiles, *, alpn_protocols: Sequence[str] | None = None
) -> ssl.SSLContext:
    """Return a verifying client context that trusts only the test CA.

    Args:
        tls: the files from :func:`generate_tls_files`.
        alpn_protocols: protocols to offer, e.g. ``["h2"]``; ``None`` offers none and
            leaves the choice to the client library (httpx sets its own).
    """
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca)
    if alpn_protocols is not None:
        context.set_alpn_protocols(list(alpn_protocols))
    return context


def _key_usage(*, key_cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=key_cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _general_names() -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for name in SERVER_NAMES:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            names.append(x509.DNSName(name))
    return names
