"""Valkey over TLS as the chart configures it (issue #38): an external Valkey with a private CA and a client
certificate from a Secret, and TLS on the bundled Valkey. The external case runs the real proxy with the URL
and the files the chart gives it (the Secret's keys laid out where the chart mounts them) against a real
valkey-server behind a TLS front that requires client certificates."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sessionmem_core import env
from sessionmem_core.devauth import dev_token
from tests.chart.test_lint import (
    CHART,
    NAMESPACE,
    RELEASE,
    Doc,
    containers,
    find,
    names,
    pod_spec,
    render,
    resolved_env,
    run_helm,
)
from tests.support.conversations import exchange
from tests.support.processes import dev_proxy
from tests.support.tls import PrivateCA, TlsFront
from tests.support.valkey import ValkeyProcess

AUTH = {"Authorization": f"Bearer {dev_token('team-a', 'support-agent')}"}


def _proxy_container(docs: list[Doc]) -> Doc:
    return containers(find(docs, "Deployment", names()["proxy"]))[0]


def _mounted_secrets(docs: list[Doc]) -> dict[str, str]:
    """mountPath -> Secret name, for the proxy's Secret volumes."""
    deployment = find(docs, "Deployment", names()["proxy"])
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod_spec(deployment)["volumes"] if "secret" in v}
    return {m["mountPath"]: secrets[m["name"]] for m in _proxy_container(docs)["volumeMounts"] if m["name"] in secrets}


@pytest.fixture
def mutual_front(valkey_server: ValkeyProcess, tmp_path: Path) -> Iterator[tuple[TlsFront, PrivateCA]]:
    ca = PrivateCA(tmp_path)
    front = TlsFront(valkey_server.port, ca.issue("valkey", server=True), client_ca=ca.cert_path)
    front.start()
    yield front, ca
    front.close()


def test_an_external_valkey_with_a_private_ca_and_client_certificates_works_as_rendered(
    mutual_front: tuple[TlsFront, PrivateCA], tmp_path: Path
) -> None:
    front, ca = mutual_front
    docs = render(
        "--set", "valkey.enabled=false",
        "--set", f"externalValkey.url=valkeys://127.0.0.1:{front.port}/0",
        "--set", "externalValkey.tls.existingSecret=valkey-certs",
        "--set", "externalValkey.tls.certKey=tls.crt",
        "--set", "externalValkey.tls.keyKey=tls.key",
    )  # fmt: skip
    mounts = _mounted_secrets(docs)
    assert list(mounts.values()) == ["valkey-certs"]
    # The Secret as the kubelet would lay it out: one file per key, under the mount path.
    client = ca.issue("sessionmem-proxy", server=False)
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    for key, source in {"ca.crt": ca.cert_path, "tls.crt": client.cert, "tls.key": client.key}.items():
        shutil.copy(source, secret_dir / key)
    url = resolved_env(_proxy_container(docs), {})[env.VALKEY_URL]
    (mount_path,) = mounts
    assert url.startswith(f"valkeys://127.0.0.1:{front.port}/0?") and url.count(mount_path) == 3

    def append_status() -> int:
        proxy = dev_proxy(url.replace(mount_path, str(secret_dir)))
        proxy.start()
        try:
            with httpx.Client(base_url=proxy.base_url, headers=AUTH, timeout=10) as http:
                return http.post("/v1/conversations/rendered/entries", json=exchange("t1")).status_code
        finally:
            proxy.stop()

    assert append_status() == 200
    # A client certificate the server's CA did not sign: the handshake fails, every operation is a 503.
    stranger = PrivateCA(tmp_path, "another CA").issue("intruder", server=False)
    shutil.copy(stranger.cert, secret_dir / "tls.crt")
    shutil.copy(stranger.key, secret_dir / "tls.key")
    assert append_status() == 503
    # A Secret without the key the values name: the proxy refuses to start, naming the file it looked for.
    (secret_dir / "tls.crt").unlink()
    with pytest.raises(RuntimeError, match=r"cannot load the Valkey TLS files \(.*ssl_certfile=.*tls\.crt"):
        dev_proxy(url.replace(mount_path, str(secret_dir))).start()


def test_tls_on_the_bundled_valkey_serves_tls_only_and_the_proxy_verifies_it() -> None:
    docs = render(
        "--set", "valkey.tls.enabled=true",
        "--set", "valkey.tls.existingSecret=valkey-server-tls",
        "--set", "valkey.tls.clientExistingSecret=proxy-client-tls",
    )  # fmt: skip
    config = find(docs, "ConfigMap", names()["valkey"])["data"]["valkey.conf"].splitlines()
    assert "port 0" in config and "tls-port 6379" in config and "tls-auth-clients yes" in config
    url = resolved_env(_proxy_container(docs), {"VALKEY_PASSWORD": "pw"})[env.VALKEY_URL]
    host = f"{names()['valkey']}.{NAMESPACE}.svc.cluster.local"
    assert url.startswith(f"valkeys://sessionmem-proxy:pw@{host}:6379/0?ssl_ca_certs=/etc/sessionmem/valkey-tls/ca.crt")
    assert "ssl_certfile=/etc/sessionmem/valkey-client-tls/tls.crt" in url
    assert set(_mounted_secrets(docs).values()) == {"valkey-server-tls", "proxy-client-tls"}
    valkey = containers(find(docs, "StatefulSet", names()["valkey"]))[-1]
    probe = valkey["readinessProbe"]["exec"]["command"][-1]
    assert "--tls --cacert /tls/ca.crt --cert /tls-client/tls.crt" in probe


def test_without_tls_values_nothing_about_tls_is_rendered() -> None:
    docs = render()
    url = resolved_env(_proxy_container(docs), {"VALKEY_PASSWORD": "pw"})[env.VALKEY_URL]
    assert url.startswith("valkey://") and "?" not in url
    assert _mounted_secrets(docs) == {}
    assert "tls-port" not in find(docs, "ConfigMap", names()["valkey"])["data"]["valkey.conf"]


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        (("valkey.enabled=false", "externalValkey.url=valkey://v:6379/0", "externalValkey.tls.existingSecret=s"),
         "needs a valkeys:// or rediss:// url"),
        (("valkey.enabled=false", "externalValkey.url=valkeys://v:6379/0", "externalValkey.tls.existingSecret=s",
          "externalValkey.tls.certKey=tls.crt"), "needs existingSecret, certKey and keyKey"),
        (("valkey.tls.enabled=true",), "valkey.tls.existingSecret is required"),
    ],
)  # fmt: skip
def test_tls_settings_that_would_not_hold_are_refused(settings: tuple[str, ...], why: str) -> None:
    args = [arg for setting in settings for arg in ("--set", setting)]
    proc = run_helm("template", RELEASE, str(CHART), *args, check=False)
    assert proc.returncode != 0 and why in proc.stderr, proc.stderr
