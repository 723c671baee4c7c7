"""The e2e tier: a real single-node cluster on this host (tools/e2e/cluster.sh), brought up once per
session and torn down after it, unless it was already running (then it is left as it was) or
SESSIONMEM_E2E_KEEP_CLUSTER=1 asks to keep it for inspection."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = REPO / "tools" / "e2e" / "cluster.sh"
UP_TIMEOUT_SECONDS = 1800.0
KEEP_CLUSTER_ENV = "SESSIONMEM_E2E_KEEP_CLUSTER"  # set to 1 to keep the cluster up after the session


@dataclass(frozen=True)
class E2ECluster:
    kubeconfig: str
    kubectl_binary: str
    image: str
    valkey_image: str
    demo_agent_image: str

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 60.0) -> str:
        """Runs kubectl against the cluster; a non-zero exit fails with kubectl's own message."""
        result = subprocess.run(
            [self.kubectl_binary, "--kubeconfig", self.kubeconfig, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def wait_until(self, what: str, timeout: float, *args: str) -> str:
        """Polls a kubectl command until it succeeds, for at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.kubectl(*args)
            except AssertionError as error:
                if time.monotonic() > deadline:
                    raise AssertionError(f"timed out after {timeout}s waiting for {what}: {error}") from error
            time.sleep(0.5)


def _cluster_script(command: str) -> str:
    result = subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), command],
        capture_output=True,
        text=True,
        timeout=UP_TIMEOUT_SECONDS,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"tools/e2e/cluster.sh {command} failed:\n{result.stderr[-4000:]}")
    return result.stdout


def _parse_env(lines: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in lines.splitlines() if "=" in line)


@pytest.fixture(scope="session")
def e2e_cluster() -> Iterator[E2ECluster]:
    if os.geteuid() != 0:
        pytest.fail("the e2e tier needs root (it runs containerd, a kubelet and iptables rules)")
    was_running = (
        subprocess.run(["bash", str(CLUSTER_SCRIPT), "env"], capture_output=True, text=True, check=False).returncode
        == 0
    )
    values = _parse_env(_cluster_script("up"))
    try:
        yield E2ECluster(
            kubeconfig=values["KUBECONFIG"],
            kubectl_binary=values["KUBECTL"],
            image=values["SESSIONMEM_IMAGE"],
            valkey_image=values["VALKEY_IMAGE"],
            demo_agent_image=values["DEMO_AGENT_IMAGE"],
        )
    finally:
        if not was_running and os.environ.get(KEEP_CLUSTER_ENV) != "1":
            _cluster_script("down")


@pytest.fixture
def namespace(e2e_cluster: E2ECluster) -> Iterator[str]:
    """A namespace of the test's own, deleted (without waiting) after it."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    e2e_cluster.kubectl("create", "namespace", name)
    # The service account controller creates "default" shortly after the namespace.
    e2e_cluster.wait_until("the default ServiceAccount", 30, "get", "serviceaccount", "default", "-n", name)
    yield name
    e2e_cluster.kubectl("delete", "namespace", name, "--wait=false")


CHART = REPO / "charts" / "sessionmem"
RELEASE = "e2e"
ROLLOUT_SECONDS = 180
COMPONENT_AND_NAME = "{.metadata.labels.app\\.kubernetes\\.io/component} {.kind}/{.metadata.name}"


def _repository_and_tag(image: str) -> tuple[str, str]:
    repository, _, tag = image.rpartition(":")
    return repository, tag


@pytest.fixture(scope="session")
def helm_binary() -> str:
    result = subprocess.run(
        ["bash", str(REPO / "tools" / "helm" / "ensure-helm.sh")], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"tools/helm/ensure-helm.sh failed:\n{result.stderr[-2000:]}")
    return result.stdout.strip().splitlines()[-1]


def helm(cluster: E2ECluster, helm_binary: str, *args: str, timeout: float = 300.0) -> str:
    """Runs helm against the cluster; a non-zero exit fails with helm's own message."""
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


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str


def release_workloads(cluster: E2ECluster, release: Release) -> dict[str, str]:
    """The release's Deployments and StatefulSets, by their `app.kubernetes.io/component` label."""
    listing = cluster.kubectl(
        *("get", "deployments,statefulsets", "-n", release.namespace),
        *("-l", f"app.kubernetes.io/instance={release.name}"),
        *("-o", "jsonpath={range .items[*]}" + COMPONENT_AND_NAME + "{'\\n'}{end}"),
    )
    return dict(line.split(" ", 1) for line in listing.splitlines() if line.strip())


@pytest.fixture(scope="session")
def release(e2e_cluster: E2ECluster, helm_binary: str) -> Iterator[Release]:
    """The chart installed once for the session with the images image.sh built, its workloads rolled
    out; uninstalled after the session."""
    # A namespace of its own each session: one still terminating from the run before is never reused.
    installed = Release(name=RELEASE, namespace=f"sessionmem-e2e-{uuid.uuid4().hex[:8]}")
    repository, tag = _repository_and_tag(e2e_cluster.image)
    valkey_repository, valkey_tag = _repository_and_tag(e2e_cluster.valkey_image)
    helm(
        e2e_cluster,
        helm_binary,
        *("install", installed.name, str(CHART), "--namespace", installed.namespace, "--create-namespace"),
        *("--set", f"image.repository={repository}", "--set", f"image.tag={tag}"),
        *("--set", f"valkey.image.repository={valkey_repository}", "--set", f"valkey.image.tag={valkey_tag}"),
        # No volume provisioner in the e2e cluster yet (tools/e2e/README.md): Valkey on an emptyDir.
        *("--set", "valkey.persistence.enabled=false"),
    )
    try:
        for workload in release_workloads(e2e_cluster, installed).values():
            e2e_cluster.kubectl(
                *("rollout", "status", workload, "-n", installed.namespace, f"--timeout={ROLLOUT_SECONDS}s"),
                timeout=ROLLOUT_SECONDS + 10,
            )
        yield installed
    finally:
        helm(e2e_cluster, helm_binary, "uninstall", installed.name, "--namespace", installed.namespace, "--wait")
        e2e_cluster.kubectl("delete", "namespace", installed.namespace, "--wait=false")
