"""The e2e cluster itself: the project's image runs as a pod that becomes Ready, the pod network,
Services and cluster DNS work, and nothing a pod sends leaves this host."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time

import pytest

from tests.e2e.conftest import E2ECluster

pytestmark = pytest.mark.e2e

POD_READY_SECONDS = 120.0


def _http_server_manifest(namespace: str, image: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "web", "namespace": namespace, "labels": {"app": "web"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "web",
                                "image": image,
                                "imagePullPolicy": "Never",
                                "command": ["python", "-m", "http.server", "8000", "--directory", "/tmp"],
                                "readinessProbe": {
                                    "httpGet": {"path": "/", "port": 8000},
                                    "periodSeconds": 1,
                                },
                                "securityContext": {
                                    "readOnlyRootFilesystem": True,
                                    "allowPrivilegeEscalation": False,
                                },
                            }
                        ]
                    },
                },
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": "web", "namespace": namespace},
                    "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8000}]},
                },
            ],
        }
    )


def _host_default_gateway() -> str:
    routes = json.loads(
        subprocess.run(["ip", "-j", "route", "show", "default"], capture_output=True, text=True, check=True).stdout
    )
    if not routes or "gateway" not in routes[0]:
        pytest.fail("this host has no default gateway to probe")
    gateway: str = routes[0]["gateway"]
    return gateway


def _finished_phase(cluster: E2ECluster, namespace: str, pod: str, timeout: float) -> str:
    """Polls a run-once pod until it has Succeeded or Failed, for at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        phase = cluster.kubectl("get", f"pod/{pod}", "-n", namespace, "-o", "jsonpath={.status.phase}")
        if phase in ("Succeeded", "Failed"):
            return phase
        if time.monotonic() > deadline:
            raise AssertionError(f"pod {namespace}/{pod} still {phase or 'unscheduled'} after {timeout}s")
        time.sleep(0.5)


def test_image_runs_as_a_pod_that_becomes_ready(e2e_cluster: E2ECluster, namespace: str) -> None:
    e2e_cluster.kubectl("apply", "-f", "-", stdin=_http_server_manifest(namespace, e2e_cluster.image))

    e2e_cluster.kubectl(
        "wait",
        "--for=condition=Ready",
        "pod/web",
        "-n",
        namespace,
        f"--timeout={POD_READY_SECONDS:.0f}s",
        timeout=POD_READY_SECONDS + 10,
    )
    pod = json.loads(e2e_cluster.kubectl("get", "pod/web", "-n", namespace, "-o", "json"))
    assert pod["status"]["podIP"].startswith("10.244.0.")
    # The image's own user, not root: the Dockerfile's USER survives the import into containerd.
    uid = e2e_cluster.kubectl("exec", "web", "-n", namespace, "--", "python", "-c", "import os; print(os.getuid())")
    assert uid.strip() == "10001"


def test_pod_reaches_services_by_name_and_nothing_beyond_the_host(e2e_cluster: E2ECluster, namespace: str) -> None:
    e2e_cluster.kubectl("apply", "-f", "-", stdin=_http_server_manifest(namespace, e2e_cluster.image))
    e2e_cluster.kubectl(
        "wait",
        "--for=condition=Ready",
        "pod/web",
        "-n",
        namespace,
        f"--timeout={POD_READY_SECONDS:.0f}s",
        timeout=POD_READY_SECONDS + 10,
    )
    probe = textwrap.dedent(
        """
        import json, socket, sys, time, urllib.error, urllib.request
        result = {}
        # kube-proxy programs a new endpoint a moment after the pod turns Ready; until then it refuses.
        deadline = time.monotonic() + 30
        while True:
            try:
                result["service_status"] = urllib.request.urlopen("http://web/", timeout=10).status
                break
            except urllib.error.URLError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        result["kubernetes_resolves"] = bool(socket.gethostbyname("kubernetes.default.svc.cluster.local"))
        try:
            socket.gethostbyname("pypi.org")
            result["external_name_resolves"] = True
        except OSError:
            result["external_name_resolves"] = False
        s = socket.socket()
        s.settimeout(3)
        try:
            s.connect((sys.argv[1], 53))
            result["host_gateway_reachable"] = True
        except OSError:
            result["host_gateway_reachable"] = False
        print(json.dumps(result))
        """
    )
    client = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "client", "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "client",
                    "image": e2e_cluster.image,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", probe, _host_default_gateway()],
                }
            ],
        },
    }
    e2e_cluster.kubectl("apply", "-f", "-", stdin=json.dumps(client))
    phase = _finished_phase(e2e_cluster, namespace, "client", timeout=120.0)

    logs = e2e_cluster.kubectl("logs", "client", "-n", namespace)
    assert phase == "Succeeded", logs
    result = json.loads(logs.strip().splitlines()[-1])
    assert result == {
        "service_status": 200,
        "kubernetes_resolves": True,
        "external_name_resolves": False,
        "host_gateway_reachable": False,
    }
