"""Issue #37, item 1 on a real node: `kubectl sessionmem` run as a person holding only the two Roles
docs/kubectl.md documents (parsed from it; the namespaces are the test's), through its own
`kubectl port-forward` to the chart's proxy Service, lists the agent's conversations. (The integration
tier, tests/kubectl/test_documented_rbac.py, covers every command with the reader Role, and the
port-forward up to the kubelet, which only a real node carries.)"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import yaml

from sessionmem_client.kubectl.cli import run
from tests.e2e.agents import SEED_AGENT, deploy_agent, turn
from tests.e2e.conftest import E2ECluster, Release
from tests.kubectl.test_documented_rbac import PORT_FORWARD, READER, documented_roles

pytestmark = pytest.mark.e2e

PERSON = "support-reader"


def _grant(cluster: E2ECluster, role_name: str, namespace: str, person_namespace: str) -> None:
    role = documented_roles()[role_name]
    role["metadata"]["namespace"] = namespace
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": role_name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": PERSON, "namespace": person_namespace}],
    }
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([role, binding]))


def test_the_documented_roles_are_enough_for_the_plugins_port_forward(
    e2e_cluster: E2ECluster,
    release: Release,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    endpoint = deploy_agent(e2e_cluster, namespace)
    assert turn(endpoint, "e2e-plugin", "Hi, my name is Ada").memory == "ok"

    e2e_cluster.kubectl("create", "serviceaccount", PERSON, "-n", namespace)
    _grant(e2e_cluster, READER, namespace, namespace)
    _grant(e2e_cluster, PORT_FORWARD, release.namespace, namespace)
    token = e2e_cluster.kubectl("create", "token", PERSON, "-n", namespace).strip()
    admin = yaml.safe_load(Path(e2e_cluster.kubeconfig).read_text(encoding="utf-8"))
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])
    cluster = next(c for c in admin["clusters"] if c["name"] == context["context"]["cluster"])
    kubeconfig = tmp_path / "reader.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": PERSON, "user": {"token": token}}],
                "contexts": [{"name": PERSON, "context": {"cluster": cluster["name"], "user": PERSON}}],
                "current-context": PERSON,
            }
        ),
        encoding="utf-8",
    )
    monkeypatch.setenv("PATH", f"{Path(e2e_cluster.kubectl_binary).parent}{os.pathsep}{os.environ['PATH']}")

    out, err = io.StringIO(), io.StringIO()
    code = run(
        [
            *("conversations", SEED_AGENT, "-n", namespace, "-o", "json", "--kubeconfig", str(kubeconfig)),
            *("--proxy-namespace", release.namespace, "--proxy-service", f"{release.name}-sessionmem-proxy"),
        ],
        stdout=out,
        stderr=err,
    )
    assert code == 0, err.getvalue()
    assert "e2e-plugin" in out.getvalue(), out.getvalue()
