"""Issue #38: the chart's proxy against a Valkey over TLS with a private CA and a client certificate, both
from a Secret, on the real node. The Valkey is a valkey-server behind a TLS front that requires client
certificates (the e2e Valkey image comes from a wheel built without TLS), in a pod of its own; a second
release (valkey.enabled=false, its operator watching only this namespace) points at it with
externalValkey.tls. Its proxy becomes Ready only once /readyz has reached Valkey, through TLS."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from tests.e2e.conftest import CHART, ROLLOUT_SECONDS, E2ECluster, helm, script_service_manifest
from tests.support.tls import PrivateCA

pytestmark = pytest.mark.e2e

FRONT = Path(__file__).resolve().parents[1] / "support" / "tls_front.py"
FRONT_PORT = 6380


def _secret(name: str, namespace: str, files: dict[str, Path]) -> str:
    data = {key: base64.b64encode(path.read_bytes()).decode() for key, path in files.items()}
    return json.dumps(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace}, "data": data}
    )


def _valkey_behind_tls(namespace: str, cluster: E2ECluster) -> str:
    security = {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False}
    pod = {
        "automountServiceAccountToken": False,
        "containers": [
            {
                "name": "valkey",
                "image": cluster.valkey_image,
                "imagePullPolicy": "Never",
                "command": ["valkey-server", "--bind", "127.0.0.1", "--port", "6379", "--save", "", "--dir", "/tmp"],
                "securityContext": security,
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
            },
            {
                "name": "front",
                "image": cluster.image,
                "imagePullPolicy": "Never",
                "command": [
                    *("python", f"/front/{FRONT.name}", str(FRONT_PORT), "127.0.0.1:6379"),
                    *("/tls/tls.crt", "/tls/tls.key", "/tls/ca.crt"),
                ],
                "ports": [{"name": "valkey-tls", "containerPort": FRONT_PORT}],
                "readinessProbe": {"tcpSocket": {"port": FRONT_PORT}, "periodSeconds": 1},
                "securityContext": security,
                "volumeMounts": [
                    {"name": "front", "mountPath": "/front"},
                    {"name": "tls", "mountPath": "/tls", "readOnly": True},
                ],
            },
        ],
        "volumes": [
            {"name": "front", "configMap": {"name": "valkey-tls"}},
            {"name": "tls", "secret": {"secretName": "valkey-server-tls"}},
            {"name": "tmp", "emptyDir": {}},
        ],
    }
    return script_service_manifest("valkey-tls", namespace, FRONT, pod, FRONT_PORT)


def test_the_proxy_reaches_a_tls_valkey_with_a_ca_and_client_certificate_from_a_secret(
    e2e_cluster: E2ECluster, helm_binary: str, namespace: str, tmp_path: Path
) -> None:
    host = f"valkey-tls.{namespace}.svc.cluster.local"
    ca = PrivateCA(tmp_path)
    server = ca.issue("valkey-tls", server=True, dns_names=(host,))
    client = ca.issue("sessionmem-proxy", server=False)
    server_files = {"tls.crt": server.cert, "tls.key": server.key, "ca.crt": ca.cert_path}
    client_files = {"ca.crt": ca.cert_path, "tls.crt": client.cert, "tls.key": client.key}
    e2e_cluster.kubectl("apply", "-f", "-", stdin=_secret("valkey-server-tls", namespace, server_files))
    e2e_cluster.kubectl("apply", "-f", "-", stdin=_secret("valkey-tls", namespace, client_files))
    e2e_cluster.kubectl("apply", "-f", "-", stdin=_valkey_behind_tls(namespace, e2e_cluster))
    e2e_cluster.kubectl(
        *("rollout", "status", "deployment/valkey-tls", "-n", namespace, f"--timeout={ROLLOUT_SECONDS}s"),
        timeout=ROLLOUT_SECONDS + 10,
    )

    name = "e2e-tls"
    repository, _, tag = e2e_cluster.image.rpartition(":")
    values = [
        *("--set", f"image.repository={repository}", "--set", f"image.tag={tag}"),
        *("--set", "valkey.enabled=false", "--set", f"externalValkey.url=valkeys://{host}:{FRONT_PORT}/0"),
        *("--set", "externalValkey.tls.existingSecret=valkey-tls"),
        *("--set", "externalValkey.tls.certKey=tls.crt", "--set", "externalValkey.tls.keyKey=tls.key"),
        *("--set", f"operator.watchNamespaces={{{namespace}}}", "--set", "tests.enabled=false"),
    ]
    try:
        # --wait: the proxy's readiness probe is /readyz, which answers 200 only once Valkey answered.
        helm(
            e2e_cluster,
            helm_binary,
            "install",
            name,
            str(CHART),
            "-n",
            namespace,
            *values,
            "--wait",
            "--timeout",
            "180s",
        )
        front_log = e2e_cluster.kubectl("logs", "deployment/valkey-tls", "-c", "front", "-n", namespace)
        assert "client certificate: True" in front_log, front_log
        selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=proxy"
        ready = e2e_cluster.kubectl(
            "get", "deployment", "-n", namespace, "-l", selector, "-o", "jsonpath={.items[0].status.readyReplicas}"
        )
        assert int(ready or 0) >= 1
    finally:
        helm(e2e_cluster, helm_binary, "uninstall", name, "-n", namespace, "--wait", "--timeout", "180s")
