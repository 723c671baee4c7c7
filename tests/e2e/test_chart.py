"""Issue #19, step 1: the chart installs on a real cluster with the locally built images; the
operator, the proxy and Valkey become Ready and `helm test` passes."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import REPO, E2ECluster

pytestmark = pytest.mark.e2e

CHART = REPO / "charts" / "sessionmem"
RELEASE = "e2e"
# Unique per run: a namespace still terminating from the run before must not be reused.
NAMESPACE = f"sessionmem-e2e-{uuid.uuid4().hex[:8]}"
ROLLOUT_SECONDS = 180
COMPONENT_AND_NAME = "{.metadata.labels.app\\.kubernetes\\.io/component} {.kind}/{.metadata.name}"


def _repository_and_tag(image: str) -> tuple[str, str]:
    repository, _, tag = image.rpartition(":")
    return repository, tag


@pytest.fixture(scope="module")
def helm_binary() -> str:
    result = subprocess.run(
        ["bash", str(REPO / "tools" / "helm" / "ensure-helm.sh")], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"tools/helm/ensure-helm.sh failed:\n{result.stderr[-2000:]}")
    return result.stdout.strip().splitlines()[-1]


def _helm(cluster: E2ECluster, helm_binary: str, *args: str, timeout: float = 300.0) -> str:
    result = subprocess.run(
        [helm_binary, "--kubeconfig", cluster.kubeconfig, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed: {result.stderr.strip()}\n{result.stdout[-2000:]}")
    return result.stdout


@pytest.fixture(scope="module")
def release(e2e_cluster: E2ECluster, helm_binary: str) -> Iterator[str]:
    """The chart installed once for the module, uninstalled after it."""
    repository, tag = _repository_and_tag(e2e_cluster.image)
    valkey_repository, valkey_tag = _repository_and_tag(e2e_cluster.valkey_image)
    _helm(
        e2e_cluster,
        helm_binary,
        *("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace"),
        *("--set", f"image.repository={repository}", "--set", f"image.tag={tag}"),
        *("--set", f"valkey.image.repository={valkey_repository}", "--set", f"valkey.image.tag={valkey_tag}"),
        # No volume provisioner in the e2e cluster yet (tools/e2e/README.md): Valkey on an emptyDir.
        *("--set", "valkey.persistence.enabled=false"),
    )
    try:
        yield RELEASE
    finally:
        _helm(e2e_cluster, helm_binary, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
        e2e_cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


def _workloads(cluster: E2ECluster) -> dict[str, str]:
    """The release's Deployments and StatefulSets, by their `app.kubernetes.io/component` label."""
    listing = cluster.kubectl(
        *("get", "deployments,statefulsets", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}"),
        "-o",
        "jsonpath={range .items[*]}" + COMPONENT_AND_NAME + "{'\\n'}{end}",
    )
    return dict(line.split(" ", 1) for line in listing.splitlines() if line.strip())


def _wait_for_rollouts(cluster: E2ECluster) -> dict[str, str]:
    workloads = _workloads(cluster)
    for workload in workloads.values():
        cluster.kubectl(
            *("rollout", "status", workload, "-n", NAMESPACE, f"--timeout={ROLLOUT_SECONDS}s"),
            timeout=ROLLOUT_SECONDS + 10,
        )
    return workloads


def test_operator_proxy_and_valkey_become_ready(e2e_cluster: E2ECluster, release: str) -> None:
    workloads = _wait_for_rollouts(e2e_cluster)

    assert set(workloads) == {"operator", "proxy", "valkey"}, workloads


def test_helm_test_passes(e2e_cluster: E2ECluster, helm_binary: str, release: str) -> None:
    _wait_for_rollouts(e2e_cluster)

    output = _helm(e2e_cluster, helm_binary, "test", release, "--namespace", NAMESPACE, "--timeout", "120s")

    phases = [line.split(":", 1)[1].strip() for line in output.splitlines() if line.startswith("Phase:")]
    assert phases, output
    assert all(phase == "Succeeded" for phase in phases), output
