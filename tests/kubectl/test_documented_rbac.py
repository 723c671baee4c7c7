"""The Roles docs/kubectl.md gives a support team, applied exactly as documented (only the namespaces are
the test's) on the real kube-apiserver, and the plugin run with nothing else (issue #37).

- memory-reader, through the real proxy (``--proxy-url``): status, conversations, show, and export of one
  conversation and of a whole agent (which lists first) all work; erase is refused.
- memory-proxy-port-forward, through the plugin's own ``kubectl port-forward`` (a real kubectl of the API
  server's version): the Service is read, its pods listed and watched, a running one picked, and the
  forward opened past RBAC. Here no kubelet runs (the pod is a status written by the test on a Node
  object whose kubelet port nothing listens on), so the forward stops where the API server dials the
  kubelet: "error dialing backend". The e2e tier (tests/e2e, a real node) carries the forward through.
  The same Role without ``list``/``watch`` on pods is refused, as the old documentation's was.
"""

from __future__ import annotations

import copy
import io
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sessionmem_client.kubectl.cli import run
from tests.harness import KubeTestCluster
from tests.harness.fixtures import namespace_name_for
from tests.harness.kubectl import kubectl_binary
from tests.kubectl.conftest import AGENT, MemoryWorld, Result
from tests.support.valkey import free_port

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "kubectl.md"
PERSON = "dave-support"
READER, PORT_FORWARD = "memory-reader", "memory-proxy-port-forward"
PROXY_SERVICE = "sm-sessionmem-proxy"
NODE = "envtest-node"


def documented_roles() -> dict[str, dict[str, Any]]:
    blocks = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)]
    return {b["metadata"]["name"]: b for b in blocks if isinstance(b, dict) and b.get("kind") == "Role"}


def grant(cluster: KubeTestCluster, role: dict[str, Any], namespace: str, person_namespace: str) -> None:
    role = copy.deepcopy(role)
    role["metadata"]["namespace"] = namespace
    name = role["metadata"]["name"]
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": PERSON, "namespace": person_namespace}],
    }
    cluster.apply_manifests([role, binding])


def plugin(kubeconfig: Path, *args: str) -> Result:
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    err = io.StringIO()
    code = run([*args, "--kubeconfig", str(kubeconfig)], stdout=out, stderr=err)
    out.flush()
    raw = out.buffer.getvalue()
    return Result(code, raw.decode(), err.getvalue(), raw)


def a_running_proxy_pod(cluster: KubeTestCluster, namespace: str) -> None:
    """What `kubectl port-forward service/...` looks for: the Service, and a running pod it selects on a
    node (whose kubelet nothing serves here)."""
    labels = {"app.kubernetes.io/component": "proxy"}
    cluster.apply_manifests(
        [
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}},
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": PROXY_SERVICE, "namespace": namespace},
                "spec": {"selector": labels, "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]},
            },
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "proxy-0", "namespace": namespace, "labels": labels},
                "spec": {
                    "nodeName": NODE,
                    "automountServiceAccountToken": False,
                    "containers": [
                        {"name": "proxy", "image": "proxy:1", "ports": [{"name": "http", "containerPort": 8000}]}
                    ],
                },
            },
        ]
    )
    node_status = {
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": free_port()}},
    }
    cluster.rest.request(
        "PATCH", f"/api/v1/nodes/{NODE}/status", body={"status": node_status}, content_type=MERGE_PATCH
    )
    pod_status = {
        "phase": "Running",
        "podIP": "127.0.0.1",
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    cluster.rest.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/proxy-0/status",
        body={"status": pod_status},
        content_type=MERGE_PATCH,
    )


MERGE_PATCH = "application/merge-patch+json"


@pytest.fixture
def dave(world: MemoryWorld, tmp_path: Path) -> Path:
    cluster = world.cluster
    cluster.create_service_account(world.namespace, PERSON)
    token = cluster.mint_service_account_token(world.namespace, PERSON, cluster.issuer)
    return cluster.write_kubeconfig(tmp_path / "dave.kubeconfig", token=token, user=PERSON)


def test_the_documented_reader_role_reads_every_way_and_erases_nothing(world: MemoryWorld, dave: Path) -> None:
    grant(world.cluster, documented_roles()[READER], world.namespace, world.namespace)
    where = ("-n", world.namespace, "--proxy-url", world.proxy.base_url)
    for command in (
        ("status", AGENT),
        ("conversations", AGENT),
        ("show", AGENT, "c1"),
        ("export", AGENT, "c1"),
        ("export", AGENT),  # the whole agent: lists, then reads each conversation
    ):
        result = plugin(dave, *command, *where)
        assert result.code == 0, (command, result.err)
    assert plugin(dave, "export", AGENT, *where).out.count("\n") >= 4
    refused = plugin(dave, "erase", AGENT, "c1", "--yes", *where)
    assert refused.code != 0 and "Forbidden" in refused.err
    assert world.stored_keys(), "nothing was erased"


@pytest.mark.parametrize("documented", [True, False], ids=["as-documented", "without-list-watch-on-pods"])
def test_the_documented_port_forward_role_gets_the_plugin_past_rbac(
    world: MemoryWorld, dave: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, documented: bool
) -> None:
    cluster = world.cluster
    proxy_namespace = cluster.create_namespace(namespace_name_for(f"{request.node.name}-proxy"))
    try:
        roles = documented_roles()
        grant(cluster, roles[READER], world.namespace, world.namespace)
        port_forward = copy.deepcopy(roles[PORT_FORWARD])
        if not documented:  # what docs/kubectl.md listed before: get on the Service and the pods
            for rule in port_forward["rules"]:
                if rule["resources"] == ["pods"]:
                    rule["verbs"] = ["get"]
        grant(cluster, port_forward, proxy_namespace, world.namespace)
        a_running_proxy_pod(cluster, proxy_namespace)
        monkeypatch.setenv("PATH", f"{kubectl_binary().parent}{os.pathsep}{os.environ['PATH']}")

        result = plugin(
            dave,
            "conversations",
            AGENT,
            "-n",
            world.namespace,
            "--proxy-namespace",
            proxy_namespace,
            "--proxy-service",
            PROXY_SERVICE,
        )
        assert result.code != 0  # no kubelet behind the node: the forward cannot carry bytes here
        assert "kubectl port-forward to the memory proxy failed" in result.err, result.err
        if documented:
            assert "forbidden" not in result.err.lower(), result.err
            assert "error dialing backend" in result.err, result.err
        else:
            assert 'cannot list resource "pods"' in result.err, result.err
            assert "memory-proxy-port-forward" in result.err, "the error names the documented Role"
    finally:
        cluster.delete_namespace(proxy_namespace)
        cluster.rest.delete("v1", "Node", NODE)
