"""The e2e cluster itself: the project's image runs as a pod that becomes Ready, the pod network,
Services, cluster DNS and the API server (with the kubelet-projected token) are reachable from a pod,
and nothing a pod sends leaves this host."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import E2ECluster, finished_phase

pytestmark = pytest.mark.e2e

POD_READY_SECONDS = 120.0
# "Beyond the host": a network namespace of the test's own behind a veth pair, outside the pod range.
OUTSIDE_NETNS = "sessionmem-e2e-outside"
OUTSIDE_HOST_LINK = "sme2e-out0"
OUTSIDE_PEER_LINK = "sme2e-out1"
OUTSIDE_GATEWAY = "10.245.255.1"
OUTSIDE_ADDRESS = "10.245.255.2"
OUTSIDE_PORT = 8080


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


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], capture_output=True, check=check)


@pytest.fixture
def outside_listener(tmp_path: Path) -> Iterator[str]:
    """An HTTP listener in a network namespace of the test's own, routed from this host as any network
    beyond it would be: what a pod must not reach. Yields its URL once this host itself reaches it."""
    # Leftovers of an interrupted run go first.
    _ip("netns", "delete", OUTSIDE_NETNS, check=False)
    _ip("link", "delete", OUTSIDE_HOST_LINK, check=False)
    server: subprocess.Popen[bytes] | None = None
    try:
        _ip("netns", "add", OUTSIDE_NETNS)
        _ip("link", "add", OUTSIDE_HOST_LINK, "type", "veth", "peer", "name", OUTSIDE_PEER_LINK)
        _ip("link", "set", OUTSIDE_PEER_LINK, "netns", OUTSIDE_NETNS)
        _ip("addr", "add", f"{OUTSIDE_GATEWAY}/30", "dev", OUTSIDE_HOST_LINK)
        _ip("link", "set", OUTSIDE_HOST_LINK, "up")
        _ip("-n", OUTSIDE_NETNS, "addr", "add", f"{OUTSIDE_ADDRESS}/30", "dev", OUTSIDE_PEER_LINK)
        _ip("-n", OUTSIDE_NETNS, "link", "set", OUTSIDE_PEER_LINK, "up")
        _ip("-n", OUTSIDE_NETNS, "route", "add", "default", "via", OUTSIDE_GATEWAY)
        server = subprocess.Popen(
            [
                *("ip", "netns", "exec", OUTSIDE_NETNS),
                *(sys.executable, "-m", "http.server", "--bind", OUTSIDE_ADDRESS),
                *("--directory", str(tmp_path), str(OUTSIDE_PORT)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://{OUTSIDE_ADDRESS}:{OUTSIDE_PORT}/"
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    assert response.status == 200
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield url
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        _ip("netns", "delete", OUTSIDE_NETNS, check=False)
        _ip("link", "delete", OUTSIDE_HOST_LINK, check=False)


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


def test_pod_reaches_services_and_the_api_by_name_and_nothing_beyond_the_host(
    e2e_cluster: E2ECluster, namespace: str, outside_listener: str
) -> None:
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
        import json, socket, ssl, sys, time, urllib.error, urllib.request
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
        # The kubelet-projected token authenticates the pod to the API server through its Service.
        account = "/var/run/secrets/kubernetes.io/serviceaccount"
        request = urllib.request.Request(
            "https://kubernetes.default.svc/api",
            headers={"Authorization": "Bearer " + open(account + "/token").read()},
        )
        tls = ssl.create_default_context(cafile=account + "/ca.crt")
        result["api_status"] = urllib.request.urlopen(request, timeout=10, context=tls).status
        try:
            socket.gethostbyname("pypi.org")
            result["external_name_resolves"] = True
        except OSError:
            result["external_name_resolves"] = False
        try:
            urllib.request.urlopen(sys.argv[1], timeout=3)
            result["outside_reachable"] = True
        except OSError:
            result["outside_reachable"] = False
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
                    "command": ["python", "-c", probe, outside_listener],
                }
            ],
        },
    }
    e2e_cluster.kubectl("apply", "-f", "-", stdin=json.dumps(client))
    phase = finished_phase(e2e_cluster, namespace, "client", timeout=120.0)

    logs = e2e_cluster.kubectl("logs", "client", "-n", namespace)
    assert phase == "Succeeded", logs
    result = json.loads(logs.strip().splitlines()[-1])
    assert result == {
        "service_status": 200,
        "api_status": 200,
        "external_name_resolves": False,
        "outside_reachable": False,
    }


def test_the_hosts_own_connections_to_an_unserved_service_ip_never_leave_it(e2e_cluster: E2ECluster) -> None:
    """A Service IP kube-proxy has not programmed (here: one no Service has) is refused on this host at
    once; without that, the host's default route would carry it off the machine to whoever answers."""
    import socket

    # An address of the Service range (tools/e2e/cluster.sh: 10.96.0.0/24) that no Service holds. Taken
    # from the range's low band, which the API server hands out only on request (it allocates the
    # others at random: a fixed high address collided with a Knative Service in one run).
    taken = set(e2e_cluster.kubectl("get", "services", "-A", "-o", "jsonpath={.items[*].spec.clusterIP}").split())
    unused = next(ip for ip in (f"10.96.0.{n}" for n in range(2, 16)) if ip not in taken)
    with socket.socket() as sock:
        sock.settimeout(5)
        try:
            sock.connect((unused, 80))
        except OSError as exc:
            refused = exc
        else:
            raise AssertionError(f"something answered on {unused}:80")
    assert isinstance(refused, ConnectionRefusedError), refused
