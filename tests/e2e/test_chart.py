"""Issue #19, step 1: the chart installs on a real cluster with the locally built images; the
operator, the proxy and Valkey become Ready and `helm test` passes."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import E2ECluster, Release, helm, release_workloads

pytestmark = pytest.mark.e2e


def test_operator_proxy_and_valkey_become_ready(e2e_cluster: E2ECluster, release: Release) -> None:
    workloads = release_workloads(e2e_cluster, release)

    assert set(workloads) == {"operator", "proxy", "valkey"}, workloads
    for workload in workloads.values():
        status = json.loads(e2e_cluster.kubectl("get", workload, "-n", release.namespace, "-o", "json"))["status"]
        assert status.get("readyReplicas", 0) >= 1, (workload, status)


def test_helm_test_passes(e2e_cluster: E2ECluster, helm_binary: str, release: Release) -> None:
    output = helm(e2e_cluster, helm_binary, "test", release.name, "--namespace", release.namespace, "--timeout", "120s")

    phases = [line.split(":", 1)[1].strip() for line in output.splitlines() if line.startswith("Phase:")]
    assert phases, output
    assert all(phase == "Succeeded" for phase in phases), output
