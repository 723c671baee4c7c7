"""The e2e tier: a real single-node cluster on this host (tools/e2e/cluster.sh), brought up once per
session and torn down after it, unless it was already running (then it is left as it was) or
SESSIONMEM_E2E_KEEP_CLUSTER=1 asks to keep it for inspection."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
import warnings
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = REPO / "tools" / "e2e" / "cluster.sh"
UP_TIMEOUT_SECONDS = 1800.0
KEEP_CLUSTER_ENV = "SESSIONMEM_E2E_KEEP_CLUSTER"  # set to 1 to keep the cluster up after the session


@dataclass(frozen=True)
class KnativeServing:
    """Knative Serving as cluster.sh installs it: ``ingress`` is its test ingress (kingress) as this host
    reaches it, routing by host; routes are named ``{name}.{namespace}.{domain}``."""

    version: str
    ingress: str
    domain: str


@dataclass(frozen=True)
class E2ECluster:
    kubeconfig: str
    kubectl_binary: str
    image: str
    valkey_image: str
    demo_agent_image: str
    run_dir: Path  # the cluster's state on this host ($E2E_RUN_DIR), removed by `cluster.sh down`
    knative_serving: KnativeServing | None = None  # None when the cluster was brought up with E2E_KNATIVE=0

    def knative(self) -> KnativeServing:
        if self.knative_serving is None:
            raise AssertionError("this cluster runs without Knative Serving (it was brought up with E2E_KNATIVE=0)")
        return self.knative_serving

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


class NodeHiccup(UserWarning):
    """This host's node did something no cluster should (a pod it never finished stopping) and the test
    worked around it; the warning carries what the node said."""


# Past a pod's grace period, how long its node may still take to report it stopped before the test
# removes it from the API itself.
STOP_SLACK_SECONDS = 60.0
TAIL_LINES = 30


def _last_errors(path: Path, is_error: Callable[[str], bool]) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as error:
        return f"({path}: {error})"
    return "\n".join([line[:400] for line in lines if is_error(line)][-TAIL_LINES:])


def _klog_error(line: str) -> bool:
    return line[:1] in ("E", "W") and line[1:5].isdigit()  # klog's "E1206 02:39:34.05 ..." prefix


def _logrus_error(line: str) -> bool:
    return "level=error" in line or "level=warning" in line


def node_diagnostics(cluster: E2ECluster) -> str:
    """What the node says now: every pod's phase and readiness, recent warning events, and the last
    errors of the kubelet and containerd. A failing e2e test carries it in its report, so a CI failure
    can be read after the cluster is gone."""
    parts = []
    for title, args in (
        ("pods", ("get", "pods", "-A", "-o", "wide")),
        ("warning events", ("get", "events", "-A", "--field-selector", "type=Warning")),
    ):
        try:
            parts.append(f"--- {title}\n" + cluster.kubectl(*args, timeout=20))
        except (AssertionError, subprocess.TimeoutExpired) as error:
            parts.append(f"--- {title}: {error}")
    logs = cluster.run_dir / "logs"
    parts.append("--- kubelet errors\n" + _last_errors(logs / "kubelet.log", _klog_error))
    parts.append("--- containerd errors\n" + _last_errors(logs / "containerd.log", _logrus_error))
    return "\n".join(parts)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    cluster = getattr(item, "funcargs", {}).get("e2e_cluster")
    if report.failed and isinstance(cluster, E2ECluster):
        report.sections.append(("the cluster at failure", node_diagnostics(cluster)))
    return report


def _pod_uid(cluster: E2ECluster, namespace: str, pod: str) -> str:
    try:
        return cluster.kubectl("get", f"pod/{pod}", "-n", namespace, "-o", "jsonpath={.metadata.uid}")
    except AssertionError:
        return ""  # gone


def force_out_stuck_pods(cluster: E2ECluster, namespace: str, *selector: str) -> list[str]:
    """Removes by force, with a NodeHiccup warning, the pods ``selector`` (kubectl's ``-l ...`` or
    ``--field-selector ...``) names that are still there ``STOP_SLACK_SECONDS`` past their deletion deadline
    (``deletionTimestamp`` is when their grace period ends); answers their names. The kubelet kills what
    outlives its grace period, so a stop that hangs longer is this host's runtime, and a pod left
    Terminating would keep its owner from replacing it for every later test."""
    pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, *selector, "-o", "json"))["items"]
    now = datetime.now(UTC)
    stuck = [
        pod["metadata"]["name"]
        for pod in pods
        if "deletionTimestamp" in pod["metadata"]
        and now > datetime.fromisoformat(pod["metadata"]["deletionTimestamp"]) + timedelta(seconds=STOP_SLACK_SECONDS)
    ]
    if stuck:
        warnings.warn(
            NodeHiccup(f"pods {namespace}/{stuck} never stopped; removed by force.\n{node_diagnostics(cluster)}"),
            stacklevel=2,
        )
        cluster.kubectl("delete", "pods", *stuck, "-n", namespace, "--grace-period=0", "--force", "--wait=false")
    return stuck


def delete_pod(cluster: E2ECluster, namespace: str, pod: str) -> None:
    """Deletes a pod gracefully (its own grace period) and returns once it is gone, forcing it out when its
    node does not stop it (``force_out_stuck_pods``)."""
    uid = _pod_uid(cluster, namespace, pod)
    cluster.kubectl("delete", "pod", pod, "-n", namespace, "--wait=false")
    while _pod_uid(cluster, namespace, pod) == uid:
        if force_out_stuck_pods(cluster, namespace, "--field-selector", f"metadata.name={pod}"):
            break
        time.sleep(1)


def finished_phase(cluster: E2ECluster, namespace: str, pod: str, timeout: float) -> str:
    """Polls a run-once pod until it has Succeeded or Failed, for at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        phase = cluster.kubectl("get", f"pod/{pod}", "-n", namespace, "-o", "jsonpath={.status.phase}")
        if phase in ("Succeeded", "Failed"):
            return phase
        if time.monotonic() > deadline:
            raise AssertionError(f"pod {namespace}/{pod} still {phase or 'unscheduled'} after {timeout}s")
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
            run_dir=Path(values["E2E_RUN_DIR"]),
            knative_serving=(
                KnativeServing(values["KNATIVE_VERSION"], values["KNATIVE_INGRESS"], values["KNATIVE_DOMAIN"])
                if "KNATIVE_INGRESS" in values
                else None
            ),
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
    valkey_volume: Path  # where the release's Valkey keeps its AOF, on this host


# The e2e cluster has no volume provisioner: PersistentVolumes are directories under its run directory,
# each bound ahead to the one claim it is for.
STORAGE_CLASS = "sessionmem-e2e-local"
# The chart's Valkey runs as uid/gid 999 (templates/valkey/statefulset.yaml); the kubelet applies no fsGroup
# to a hostPath volume, so its directory is made theirs here.
VALKEY_UID = 999
VALKEY_VOLUME_SIZE = "1Gi"


def local_volume(cluster: E2ECluster, namespace: str, claim: str, uid: int, size: str) -> Path:
    """A hostPath PersistentVolume of ``size`` owned by ``uid``, bound ahead to the claim ``namespace/claim``
    (which may not exist yet); returns its directory on this host."""
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {"name": STORAGE_CLASS},
                "provisioner": "kubernetes.io/no-provisioner",
                "reclaimPolicy": "Retain",
                "volumeBindingMode": "Immediate",
            }
        ),
    )
    name = f"{namespace}-{claim}"
    path = cluster.run_dir / "volumes" / name
    path.mkdir(parents=True)
    os.chown(path, uid, uid)
    path.chmod(0o700)
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "hostPath": {"path": str(path), "type": "Directory"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(volume))
    return path


def release_workloads(cluster: E2ECluster, release: Release) -> dict[str, str]:
    """The release's Deployments and StatefulSets, by their `app.kubernetes.io/component` label."""
    listing = cluster.kubectl(
        *("get", "deployments,statefulsets", "-n", release.namespace),
        *("-l", f"app.kubernetes.io/instance={release.name}"),
        *("-o", "jsonpath={range .items[*]}" + COMPONENT_AND_NAME + "{'\\n'}{end}"),
    )
    return dict(line.split(" ", 1) for line in listing.splitlines() if line.strip())


def valkey_cli(cluster: E2ECluster, release: Release, *args: str) -> list[str]:
    """valkey-cli in the release's Valkey pod, as the proxy's ACL user (what the proxy itself may run);
    its answer's lines."""
    statefulset = release_workloads(cluster, release)["valkey"].split("/", 1)[1]
    script = 'REDISCLI_AUTH="$VALKEY_PASSWORD" exec valkey-cli --user "$VALKEY_USER" "$@"'
    output = cluster.kubectl(
        *("exec", f"{statefulset}-0", "-n", release.namespace, "-c", "valkey", "--"),
        *("sh", "-c", script, "valkey-cli", *args),
    )
    return output.splitlines()


OTLP_PORT = 4318
# The SDK's batch processor exports every 5 s; a pod's first export also waits for its start-up.
SPAN_EXPORT_SECONDS = 60.0
OTLP_RECEIVER = REPO / "tests" / "e2e" / "otlp_receiver.py"


@dataclass(frozen=True)
class OtlpReceiver:
    """tests/e2e/otlp_receiver.py running in the cluster: ``endpoint`` is its in-cluster URL (what
    OTEL_EXPORTER_OTLP_ENDPOINT names), ``url`` the same Service as this host reaches it."""

    namespace: str
    endpoint: str
    url: str

    def spans(self, trace_id: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/spans", params={"traceId": trace_id}, timeout=10)
        response.raise_for_status()
        spans: list[dict[str, Any]] = response.json()
        return spans

    def memory_spans(
        self, trace_id: str, expected: set[tuple[str, str]], timeout: float = SPAN_EXPORT_SECONDS
    ) -> dict[tuple[str, str], dict[str, Any]]:
        """The trace's memory.* spans by (service, operation), once all ``expected`` have arrived."""
        deadline = time.monotonic() + timeout
        while True:
            spans = {
                (span["service"], span["name"].removeprefix("memory.")): span
                for span in self.spans(trace_id)
                if span["name"].startswith("memory.")
            }
            if set(spans) >= expected:
                return spans
            assert time.monotonic() < deadline, f"spans of trace {trace_id} so far: {sorted(spans)}"
            time.sleep(1)


def script_service_manifest(name: str, namespace: str, script: Path, pod: dict[str, Any], port: int) -> str:
    """A Deployment of ``pod`` (labelled ``app: name``) with ``script`` in a ConfigMap named ``name`` (the
    pod mounts it), and a Service on ``port``: how the e2e brings its small helper services."""
    labels = {"app": name}
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": namespace},
                    "data": {script.name: script.read_text(encoding="utf-8")},
                },
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {
                        "selector": {"matchLabels": labels},
                        "template": {"metadata": {"labels": labels}, "spec": pod},
                    },
                },
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"selector": labels, "ports": [{"port": port, "targetPort": port}]},
                },
            ],
        }
    )


def _otlp_receiver_manifest(namespace: str, image: str) -> str:
    pod = {
        "automountServiceAccountToken": False,
        "containers": [
            {
                "name": "receiver",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["python", f"/receiver/{OTLP_RECEIVER.name}", str(OTLP_PORT)],
                "ports": [{"name": "otlp-http", "containerPort": OTLP_PORT}],
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": OTLP_PORT}, "periodSeconds": 1},
                "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False},
                "volumeMounts": [{"name": "receiver", "mountPath": "/receiver"}],
            }
        ],
        "volumes": [{"name": "receiver", "configMap": {"name": "otlp-receiver"}}],
    }
    return script_service_manifest("otlp-receiver", namespace, OTLP_RECEIVER, pod, OTLP_PORT)


@pytest.fixture(scope="session")
def otlp_receiver(e2e_cluster: E2ECluster) -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP receiver in a namespace of its own, for the session."""
    namespace = f"sessionmem-e2e-otlp-{uuid.uuid4().hex[:8]}"
    e2e_cluster.kubectl("create", "namespace", namespace)
    try:
        e2e_cluster.kubectl("apply", "-f", "-", stdin=_otlp_receiver_manifest(namespace, e2e_cluster.image))
        e2e_cluster.kubectl(
            *("rollout", "status", "deployment/otlp-receiver", "-n", namespace, f"--timeout={ROLLOUT_SECONDS}s"),
            timeout=ROLLOUT_SECONDS + 10,
        )
        cluster_ip = e2e_cluster.kubectl(
            "get", "service/otlp-receiver", "-n", namespace, "-o", "jsonpath={.spec.clusterIP}"
        )
        yield OtlpReceiver(
            namespace=namespace,
            endpoint=f"http://otlp-receiver.{namespace}.svc.cluster.local:{OTLP_PORT}",
            url=f"http://{cluster_ip}:{OTLP_PORT}",
        )
    finally:
        e2e_cluster.kubectl("delete", "namespace", namespace, "--wait=false")


@pytest.fixture(scope="session")
def release(
    e2e_cluster: E2ECluster,
    helm_binary: str,
    otlp_receiver: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Release]:
    """The chart installed once for the session with the images image.sh built, Valkey on a local
    PersistentVolume, the proxy and every launcher exporting spans to the session's OTLP receiver, and
    users' run capabilities on (a chart-generated key); its workloads rolled out; uninstalled after the
    session."""
    # A namespace of its own each session: one still terminating from the run before is never reused.
    namespace = f"sessionmem-e2e-{uuid.uuid4().hex[:8]}"
    claim = f"data-{RELEASE}-sessionmem-valkey-0"  # the StatefulSet's claim template "data", pod 0
    installed = Release(
        name=RELEASE,
        namespace=namespace,
        valkey_volume=local_volume(e2e_cluster, namespace, claim, VALKEY_UID, VALKEY_VOLUME_SIZE),
    )
    repository, tag = _repository_and_tag(e2e_cluster.image)
    valkey_repository, valkey_tag = _repository_and_tag(e2e_cluster.valkey_image)
    values = {
        "image": {"repository": repository, "tag": tag},
        "valkey": {
            "image": {"repository": valkey_repository, "tag": valkey_tag},
            "persistence": {"enabled": True, "storageClass": STORAGE_CLASS, "size": VALKEY_VOLUME_SIZE},
        },
        "proxy": {"otlpEndpoint": otlp_receiver.endpoint, "capabilityKey": {"enabled": True}},
        "operator": {"launcher": {"otlpEndpoint": otlp_receiver.endpoint}},
        # The proxy's egress is its NetworkPolicy's: the receiver is let in as a collector would be.
        "networkPolicy": {
            "proxyExtraEgress": [
                {
                    "to": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": otlp_receiver.namespace}
                            },
                            "podSelector": {"matchLabels": {"app": "otlp-receiver"}},
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": OTLP_PORT}],
                }
            ]
        },
    }
    values_file = tmp_path_factory.mktemp("release") / "values.json"
    values_file.write_text(json.dumps(values), encoding="utf-8")
    helm(
        e2e_cluster,
        helm_binary,
        *("install", installed.name, str(CHART), "--namespace", installed.namespace, "--create-namespace"),
        *("--values", str(values_file)),
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
        e2e_cluster.kubectl("delete", "persistentvolume", f"{namespace}-{claim}", "--wait=false")
