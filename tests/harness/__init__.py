"""Integration-test harness: a real kube-apiserver + etcd + kube-controller-manager (GC, namespaces).

Register the fixtures from the root conftest with ``pytest_plugins = ["tests.harness.fixtures"]``.
"""

from .apiserver import (
    ClusterStartError,
    KubeTestCluster,
    ProcessStartError,
    ensure_binaries,
    free_port,
    knative_crd_paths,
    repo_crd_paths,
)
from .fixtures import make_kubeconfig_env
from .rest import KubeApiError, KubeRestClient, ResourceInfo, load_manifests

__all__ = [
    "ClusterStartError",
    "KubeApiError",
    "KubeRestClient",
    "KubeTestCluster",
    "ProcessStartError",
    "ResourceInfo",
    "ensure_binaries",
    "free_port",
    "knative_crd_paths",
    "load_manifests",
    "make_kubeconfig_env",
    "repo_crd_paths",
]
