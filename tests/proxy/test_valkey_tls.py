"""The proxy talks to Valkey over TLS with a private CA, and with client certificates (mutual TLS), as a
managed Valkey (Memorystore, ElastiCache) asks: the real proxy process, a real valkey-server behind a TLS
front (tests/support/tls.py). It never falls back to plain text, and a certificate it cannot verify is a
503, not an unverified connection."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sessionmem_core.devauth import dev_token
from sessionmem_core.keys import Owner, session_key
from tests.support.conversations import exchange
from tests.support.processes import ServiceProcess, dev_proxy
from tests.support.tls import CertFiles, PrivateCA, TlsFront
from tests.support.valkey import ValkeyProcess

OWNER = Owner(namespace="team-a", agent="support-agent")
AUTH = {"Authorization": f"Bearer {dev_token(OWNER.namespace, OWNER.agent)}"}


@pytest.fixture
def ca(tmp_path: Path) -> PrivateCA:
    return PrivateCA(tmp_path)


@pytest.fixture
def server_cert(ca: PrivateCA) -> CertFiles:
    return ca.issue("valkey-server", server=True)


@pytest.fixture
def front(valkey_server: ValkeyProcess, server_cert: CertFiles) -> Iterator[TlsFront]:
    tls = TlsFront(valkey_server.port, server_cert)
    tls.start()
    yield tls
    tls.close()


@pytest.fixture
def mutual_front(valkey_server: ValkeyProcess, server_cert: CertFiles, ca: PrivateCA) -> Iterator[TlsFront]:
    tls = TlsFront(valkey_server.port, server_cert, client_ca=ca.cert_path)
    tls.start()
    yield tls
    tls.close()


def _proxy(url: str) -> Iterator[ServiceProcess]:
    proc = dev_proxy(url)
    proc.start()
    yield proc
    proc.stop()


def _append_and_read(proxy: ServiceProcess, conversation: str) -> httpx.Response:
    with httpx.Client(base_url=proxy.base_url, headers=AUTH, timeout=10) as client:
        appended = client.post(
            f"/v1/conversations/{conversation}/entries", json=exchange("t1", user="over TLS", assistant="heard")
        )
        if appended.status_code != 200:
            return appended
        return client.get(f"/v1/conversations/{conversation}/entries")


def test_the_proxy_stores_through_tls_verified_by_a_private_ca(
    front: TlsFront, ca: PrivateCA, valkey_server: ValkeyProcess
) -> None:
    for proxy in _proxy(f"valkeys://127.0.0.1:{front.port}/0?ssl_ca_certs={ca.cert_path}"):
        read = _append_and_read(proxy, "tls")
        assert read.status_code == 200, read.text
        assert [e["content"] for e in read.json()["entries"]] == ["over TLS", "heard"]
        assert httpx.get(f"{proxy.base_url}/readyz", timeout=5).status_code == 200
    assert valkey_server.client().llen(session_key(OWNER, "tls")) == 2


def test_a_server_certificate_from_another_ca_is_refused_not_trusted(
    front: TlsFront, tmp_path: Path, valkey_server: ValkeyProcess
) -> None:
    stranger = PrivateCA(tmp_path, "another CA")
    for proxy in _proxy(f"valkeys://127.0.0.1:{front.port}/0?ssl_ca_certs={stranger.cert_path}"):
        answer = _append_and_read(proxy, "untrusted")
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["type"] == "backend_unavailable"
        assert httpx.get(f"{proxy.base_url}/readyz", timeout=5).status_code == 503
    assert valkey_server.client().exists(session_key(OWNER, "untrusted")) == 0


def test_a_plain_url_never_reaches_a_tls_valkey(front: TlsFront) -> None:
    for proxy in _proxy(f"valkey://127.0.0.1:{front.port}/0"):
        assert _append_and_read(proxy, "plain").status_code == 503


def test_mutual_tls_needs_the_client_certificate(
    mutual_front: TlsFront, ca: PrivateCA, valkey_server: ValkeyProcess
) -> None:
    url = f"valkeys://127.0.0.1:{mutual_front.port}/0?ssl_ca_certs={ca.cert_path}"
    for proxy in _proxy(url):
        assert _append_and_read(proxy, "anonymous").status_code == 503
    client = ca.issue("sessionmem-proxy", server=False)
    for proxy in _proxy(f"{url}&ssl_certfile={client.cert}&ssl_keyfile={client.key}"):
        read = _append_and_read(proxy, "mutual")
        assert read.status_code == 200, read.text
    assert valkey_server.client().exists(session_key(OWNER, "anonymous")) == 0
    assert valkey_server.client().llen(session_key(OWNER, "mutual")) == 2
