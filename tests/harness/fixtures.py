"""pytest fixtures for the Kubernetes test harness.

Register from the root conftest: ``pytest_plugins = ["tests.harness.fixtures"]``.

- ``kube_cluster`` (session): one control plane for the whole session, with the Knative Serving CRDs and
  the project's crds/*.yaml installed before the garbage collector starts.
- ``kube_cluster_without_knative`` (module): another control plane with only the project's CRDs (no
  Knative Serving), for what the operator does on such clusters.
- ``kube_namespace`` (function): a fresh namespace named after the test, deleted afterwards.
- ``kube_api`` (function): a kubernetes_asyncio ``Configuration`` for the admin identity.
- ``kube_env`` (function): os.environ patched (KUBECONFIG set, in-cluster variables removed) so that kopf
  and kubernetes clients created in-process find the cluster.

The fixtures never skip: missing binaries are built (first run on a machine: several minutes).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from .apiserver import KubeTestCluster, ensure_binaries, knative_crd_paths, repo_crd_paths

__all__ = [
    "kube_api",
    "kube_cluster",
    "kube_cluster_without_knative",
    "kube_env",
    "kube_namespace",
    "make_kubeconfig_env",
    "namespace_name_for",
]


def make_kubeconfig_env(cluster: KubeTestCluster, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for processes (or os.environ) pointing kopf/kubernetes clients at `cluster`: a copy of
    `base` (default os.environ) with KUBECONFIG set and KUBERNETES_SERVICE_* removed (so a test run inside
    a pod does not pick the in-cluster configuration)."""
    return cluster.kubeconfig_env(base)


def namespace_name_for(test_name: str) -> str:
    """A DNS-1123 label derived from a test name, unique per call."""
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")
    slug = slug.removeprefix("test-") or "t"
    if len(slug) > 45:
        digest = hashlib.sha1(slug.encode(), usedforsecurity=False).hexdigest()[:6]
        slug = f"{slug[:38].rstrip('-')}-{digest}"
    return f"t-{slug}-{secrets.token_hex(3)}"


@pytest.fixture(scope="session")
def kube_cluster(request: pytest.FixtureRequest) -> Iterator[KubeTestCluster]:
    # A first run builds the binaries (minutes): let the build progress reach the terminal.
    capman = request.config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
        ensure_binaries()
    crds = [*knative_crd_paths(), *repo_crd_paths()]
    cluster = KubeTestCluster(crd_paths=crds)
    cluster.start()
    print(f"\n[envtest] control plane up in {cluster.startup_seconds:.1f}s at {cluster.server_url}", file=sys.stderr)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def kube_cluster_without_knative(request: pytest.FixtureRequest) -> Iterator[KubeTestCluster]:
    """A second control plane with only the project's CRDs: a cluster where Knative Serving is not installed.
    Module-scoped (it costs a control-plane start); the same shape as ``kube_cluster`` otherwise."""
    capman = request.config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
        ensure_binaries()
    cluster = KubeTestCluster(crd_paths=repo_crd_paths())
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def kube_namespace(kube_cluster: KubeTestCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = kube_cluster.create_namespace(namespace_name_for(request.node.name))
    try:
        yield name
    finally:
        if kube_cluster.processes:  # still running
            kube_cluster.delete_namespace(name)


@pytest.fixture
def kube_api(kube_cluster: KubeTestCluster) -> Any:
    """kubernetes_asyncio.client.Configuration (admin). Use as ``ApiClient(configuration=kube_api)``."""
    return kube_cluster.async_client_configuration()


@pytest.fixture
def kube_env(kube_cluster: KubeTestCluster, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = make_kubeconfig_env(kube_cluster)
    for var in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "KUBERNETES_SERVICE_PORT_HTTPS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KUBECONFIG", env["KUBECONFIG"])
    assert os.environ["KUBECONFIG"] == str(kube_cluster.kubeconfig_path)
    return env
