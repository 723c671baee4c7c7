"""The operator against a real kube-apiserver (tests/harness): CRD validation, rendering, memory wiring,
registry membership, readiness mirroring and garbage collection.

The operator runs in-process with kopf's KopfRunner (one per module), logged in through $KUBECONFIG like a
developer's operator would be. Every wait is a bounded poll.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kopf.testing import KopfRunner

from sessionmem_core import env, kube
from sessionmem_operator.kubeapi import KubeApi, KubeError
from tests.harness import KubeApiError, KubeTestCluster
from tests.harness.operator import run_operator
from tests.support.polling import poll

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "support-agent.yaml"
PROXY_URL = "http://sessionmem-proxy.sessionmem.svc:8000"
AUDIENCE = "sessionmem-test-audience"
LAUNCHER_IMAGE = "registry.example/sessionmem:test"
KSVC = "serving.knative.dev/v1"
# How long a wait may take before it fails: a guard against a hang, not a speed target (a wait returns as
# soon as its condition holds), so it is generous enough for a machine busy with other work.
WAIT_SECONDS = 60.0
_MERGE_PATCH = "application/merge-patch+json"

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = WAIT_SECONDS) -> T:
    """Poll `probe` until it returns something truthy; fail with `what` after `timeout` seconds."""
    return poll(probe, what, timeout)


# How the module's operator is configured: what the chart would tell it about its proxy.
KNOWN_CUSTOM_REDACTOR = "employee-id"
RESYNC_SECONDS = 2.0


@pytest.fixture(scope="module")
def operator(kube_cluster: KubeTestCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KopfRunner]:
    settings = {"redactors": [KNOWN_CUSTOM_REDACTOR], "userCapabilities": False, "resyncSeconds": RESYNC_SECONDS}
    environ = {
        env.OPERATOR_PROXY_URL: PROXY_URL,
        env.OPERATOR_AUDIENCE: AUDIENCE,
        env.OPERATOR_LAUNCHER_IMAGE: LAUNCHER_IMAGE,
    }
    with run_operator(kube_cluster, tmp_path_factory.mktemp("operator"), settings=settings, environ=environ) as runner:
        yield runner


# ---- helpers --------------------------------------------------------------------------------------------


def manifest(namespace: str, name: str = "support-agent", **spec: Any) -> dict[str, Any]:
    """The DESIGN.md manifest moved to `namespace`, with `spec` overrides (None removes a field)."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    doc["metadata"] = {"name": name, "namespace": namespace}
    for key, value in spec.items():
        if value is None:
            doc["spec"].pop(key, None)
        else:
            doc["spec"][key] = value
    return doc


def get(
    cluster: KubeTestCluster, api_version: str, kind: str, name: str, namespace: str | None
) -> dict[str, Any] | None:
    return cluster.rest.get(api_version, kind, name, namespace)


def agent(cluster: KubeTestCluster, namespace: str, name: str = "support-agent") -> dict[str, Any] | None:
    return get(cluster, kube.API_VERSION, kube.AGENT_KIND, name, namespace)


def condition(body: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for item in ((body or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == type_:
            return dict(item)
    return {}


def wait_condition(
    cluster: KubeTestCluster,
    namespace: str,
    type_: str,
    status: str,
    reason: str | None = None,
    name: str = "support-agent",
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        body = agent(cluster, namespace, name)
        found = condition(body, type_)
        generation = ((body or {}).get("metadata") or {}).get("generation")
        current = ((body or {}).get("status") or {}).get("observedGeneration") == generation
        if current and found.get("status") == status and (reason is None or found.get("reason") == reason):
            return body
        return None

    return wait_for(probe, f"{namespace}/{name} {type_}={status} {reason or ''}")


def pod_template(workload: dict[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = workload["spec"]["template"]
    return template


def containers(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod_template(workload)["spec"]["containers"]}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item.get("value", "") for item in container.get("env", [])}


def launcher_env(workload: dict[str, Any]) -> dict[str, str]:
    return env_of(containers(workload)["sessionmem-launcher"])


def wait_workload(
    cluster: KubeTestCluster,
    namespace: str,
    check: Callable[[dict[str, Any]], bool],
    what: str,
    api_version: str = KSVC,
    kind: str = "Service",
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        body = get(cluster, api_version, kind, "support-agent", namespace)
        return body if body is not None and check(body) else None

    return wait_for(probe, what)


def has_launcher(body: dict[str, Any]) -> bool:
    return "sessionmem-launcher" in containers(body)


def registry_manifest(name: str, members: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "apiVersion": kube.API_VERSION,
        "kind": kube.REGISTRY_KIND,
        "metadata": {"name": name},
        "spec": {"members": [{"namespace": ns, "name": agent_name} for ns, agent_name in members]},
    }


def warning_events(
    cluster: KubeTestCluster, namespace: str, reason: str, name: str = "support-agent"
) -> list[dict[str, Any]]:
    path = f"/api/v1/namespaces/{namespace}/events"
    listed = cluster.rest.request("GET", path, params={"fieldSelector": f"involvedObject.name={name}"}).json()
    return [e for e in listed.get("items", []) if e.get("type") == "Warning" and e.get("reason") == reason]


# ---- tests ----------------------------------------------------------------------------------------------


def test_design_manifest_applies_unchanged_and_is_wired(kube_cluster: KubeTestCluster, operator: KopfRunner) -> None:
    source = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    namespace = source["metadata"]["namespace"]
    kube_cluster.create_namespace(namespace)
    try:
        kube_cluster.apply_manifests(EXAMPLE)  # the file exactly as DESIGN.md shows it

        ksvc = wait_workload(kube_cluster, namespace, has_launcher, "the Knative Service with the launcher")
        owner = ksvc["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["controller"]) == (kube.AGENT_KIND, "support-agent", True)
        template = pod_template(ksvc)
        sa_name = kube.agent_service_account("support-agent")
        assert template["spec"]["serviceAccountName"] == sa_name

        launcher = containers(ksvc)["sessionmem-launcher"]
        assert launcher["image"] == LAUNCHER_IMAGE
        assert launcher["command"] == ["python", "-m", "sessionmem_launcher"]
        assert launcher["ports"][0]["containerPort"] == env.DEFAULT_SERVE_PORT
        variables = env_of(launcher)
        assert variables[env.PROXY_URL] == PROXY_URL
        assert variables[env.NAMESPACE] == namespace
        assert variables[env.AGENT] == "support-agent"
        assert variables[env.SCOPE] == "session"
        assert variables[env.PER_USER] == "false"
        assert variables[env.REPLAY_MESSAGES] == str(env.DEFAULT_REPLAY_MESSAGES)
        assert variables[env.CAP] == str(env.DEFAULT_CAP)
        assert variables[env.TTL_SECONDS] == str(env.DEFAULT_TTL_SECONDS)
        assert variables[env.TOKEN_PATH] == env.DEFAULT_TOKEN_PATH
        assert env_of(containers(ksvc)["agent"])[env.AGENT_PORT] == str(env.DEFAULT_AGENT_PORT)

        (volume,) = template["spec"]["volumes"]
        token = volume["projected"]["sources"][0]["serviceAccountToken"]
        assert token["audience"] == AUDIENCE
        assert token["expirationSeconds"] == 600
        (mount,) = launcher["volumeMounts"]
        assert mount["name"] == volume["name"] and mount["readOnly"] is True
        assert "volumeMounts" not in containers(ksvc)["agent"]

        account = wait_for(lambda: get(kube_cluster, "v1", "ServiceAccount", sa_name, namespace), "the ServiceAccount")
        assert account["automountServiceAccountToken"] is False
        assert account["metadata"]["labels"][kube.LABEL_AGENT] == "support-agent"
        assert account["metadata"]["ownerReferences"][0]["uid"] == owner["uid"]

        body = wait_condition(kube_cluster, namespace, "MemoryReady", "True", "Wired")
        assert body["status"]["scope"] == "session"
        assert body["status"]["keyPrefix"] == f"mem:{namespace}/support-agent:"
        assert body["status"]["workload"] == {"apiVersion": KSVC, "kind": "Service", "name": "support-agent"}
    finally:
        kube_cluster.delete_namespace(namespace)


def test_toggling_memory_and_changing_scope_roll_the_pod_template(
    kube_cluster: KubeTestCluster, kube_namespace: str, operator: KopfRunner
) -> None:
    ns = kube_namespace
    kube_cluster.apply_manifests(manifest(ns))
    first = wait_workload(kube_cluster, ns, has_launcher, "the wired Knative Service")
    first_template = copy.deepcopy(pod_template(first))

    # Off: the server-side apply without sessionMemory removes it; the agent serves alone.
    kube_cluster.apply_manifests(manifest(ns, sessionMemory=None))
    bare = wait_workload(kube_cluster, ns, lambda b: not has_launcher(b), "the Knative Service without launcher")
    assert pod_template(bare) != first_template
    assert "volumes" not in pod_template(bare)["spec"]
    assert containers(bare)["agent"]["ports"][0]["containerPort"] == env.DEFAULT_SERVE_PORT
    assert bare["metadata"]["generation"] > first["metadata"]["generation"]
    disabled = wait_condition(kube_cluster, ns, "MemoryReady", "False", "Disabled")
    assert "scope" not in disabled["status"] and "keyPrefix" not in disabled["status"]

    # On again, shared, as a member of a registry: the env carries the scope and registry in effect.
    registry = f"team-{ns}"[:63]
    kube_cluster.apply_manifests(registry_manifest(registry, [(ns, "support-agent")]))
    try:
        kube_cluster.apply_manifests(manifest(ns, sessionMemory={"scope": "shared"}))
        shared = wait_workload(
            kube_cluster, ns, lambda b: has_launcher(b) and launcher_env(b)[env.SCOPE] == "shared", "shared env"
        )
        assert launcher_env(shared)[env.REGISTRY] == registry
        assert pod_template(shared) != first_template
        body = wait_condition(kube_cluster, ns, "MemoryReady", "True", "Wired")
        assert body["status"]["keyPrefix"] == f"mem:shared:{registry}:"
    finally:
        kube_cluster.rest.delete(kube.API_VERSION, kube.REGISTRY_KIND, registry)


def test_shared_scope_needs_registry_membership(
    kube_cluster: KubeTestCluster, kube_namespace: str, operator: KopfRunner
) -> None:
    ns = kube_namespace
    kube_cluster.apply_manifests(manifest(ns, sessionMemory={"scope": "shared"}))

    ksvc = wait_workload(kube_cluster, ns, has_launcher, "the Knative Service")
    assert launcher_env(ksvc)[env.SCOPE] == "session"  # private layout kept
    assert env.REGISTRY not in launcher_env(ksvc)
    body = wait_condition(kube_cluster, ns, "MemoryReady", "False", "NotARegistryMember")
    assert body["status"]["scope"] == "session"
    assert body["status"]["keyPrefix"] == f"mem:{ns}/support-agent:"
    assert "no AgentRegistry lists" in condition(body, "MemoryReady")["message"]
    (event,) = wait_for(lambda: warning_events(kube_cluster, ns, "NotARegistryMember"), "the Warning Event")
    assert event["involvedObject"]["kind"] == kube.AGENT_KIND

    registry = f"team-{ns}"[:63]
    kube_cluster.apply_manifests(registry_manifest(registry, [(ns, "support-agent")]))
    try:
        shared = wait_workload(kube_cluster, ns, lambda b: launcher_env(b)[env.SCOPE] == "shared", "shared env")
        assert launcher_env(shared)[env.REGISTRY] == registry
        body = wait_condition(kube_cluster, ns, "MemoryReady", "True", "Wired")
        assert body["status"]["scope"] == "shared"
        assert body["status"]["registry"] == registry
        assert body["status"]["keyPrefix"].startswith(f"mem:shared:{registry}:")
        recorded = wait_for(
            lambda: (get(kube_cluster, kube.API_VERSION, kube.REGISTRY_KIND, registry, None) or {}).get("status"),
            "the registry status",
        )
        assert recorded["memberCount"] == 1
        assert recorded["keyPrefix"] == f"mem:shared:{registry}:"
    finally:
        kube_cluster.rest.delete(kube.API_VERSION, kube.REGISTRY_KIND, registry)

    # The registry is gone: back to the private layout, visibly.
    wait_workload(kube_cluster, ns, lambda b: launcher_env(b)[env.SCOPE] == "session", "private env again")
    wait_condition(kube_cluster, ns, "MemoryReady", "False", "NotARegistryMember")


@pytest.mark.parametrize(
    ("name", "spec", "field"),
    [
        ("bad-scope", {"image": "x", "sessionMemory": {"scope": "team"}}, "spec.sessionMemory.scope"),
        (
            "bad-addr",
            {"image": "x", "sessionMemory": {"backend": {"addr": "valkey"}}},
            "spec.sessionMemory.backend.addr",
        ),
        (
            "bad-port",
            {"image": "x", "sessionMemory": {"backend": {"addr": "v:70000"}}},
            "spec.sessionMemory.backend.addr",
        ),
        ("a" * (kube.MAX_AGENT_NAME + 1), {"image": "x"}, "metadata.name"),
        ("no-image", {"sessionMemory": {}}, "spec.image"),
        ("bad-ttl", {"image": "x", "sessionMemory": {"ttl": "2d"}}, "spec.sessionMemory.ttl"),
        ("shared-per-user", {"image": "x", "sessionMemory": {"scope": "shared", "perUser": True}}, "perUser"),
        ("port-clash", {"image": "x", "port": env.DEFAULT_SERVE_PORT, "sessionMemory": {}}, "spec.port"),
        ("knative-port", {"image": "x", "port": 8012}, "spec.port"),
        ("reserved-env", {"image": "x", "env": [{"name": env.SCOPE, "value": "shared"}]}, "spec.env[0].name"),
        ("bad-redactor", {"image": "x", "sessionMemory": {"redact": ["E-mail"]}}, "spec.sessionMemory.redact[0]"),
        ("dup-redactor", {"image": "x", "sessionMemory": {"redact": ["email", "email"]}}, "spec.sessionMemory.redact"),
        (
            "shared-summary",
            {"image": "x", "sessionMemory": {"scope": "shared", "summary": {"threshold": 100}}},
            "spec.sessionMemory.summary",
        ),
        (
            "summary-past-cap",
            {"image": "x", "sessionMemory": {"maxEntries": 100, "summary": {"threshold": 100}}},
            "spec.sessionMemory.summary.threshold",
        ),
        (
            "bad-endpoint",
            {"image": "x", "sessionMemory": {"summary": {"endpoint": "ftp://x/y"}}},
            "spec.sessionMemory.summary.endpoint",
        ),
        (
            "bad-counter",
            {"image": "x", "sessionMemory": {"tokenCounter": "tiktoken"}},
            "spec.sessionMemory.tokenCounter",
        ),
        (
            "bad-capability",
            {"image": "x", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}},
            "spec.securityContext.capabilities.add",
        ),
        (
            "bad-quantity",
            {"image": "x", "resources": {"limits": {"memory": "lots"}}},
            "spec.resources.limits.memory",
        ),
        (
            "zero-quota",
            {"image": "x", "sessionMemory": {"quota": {"maxConversations": 0}}},
            "spec.sessionMemory.quota.maxConversations",
        ),
    ],
    ids=[
        "unknown-scope",
        "malformed-addr",
        "addr-port-range",
        "name-too-long",
        "missing-image",
        "bad-ttl",
        "shared-per-user",
        "port-clash",
        "knative-reserved-port",
        "reserved-env",
        "bad-redactor",
        "duplicate-redactor",
        "summary-with-shared-scope",
        "summary-threshold-at-cap",
        "bad-summary-endpoint",
        "bad-token-counter",
        "capability-not-allowed",
        "bad-resource-quantity",
        "quota-below-one",
    ],
)
def test_invalid_manifests_are_rejected_naming_the_field(
    kube_cluster: KubeTestCluster, kube_namespace: str, name: str, spec: dict[str, Any], field: str
) -> None:
    doc = {"apiVersion": kube.API_VERSION, "kind": kube.AGENT_KIND, "metadata": {"name": name}, "spec": spec}
    with pytest.raises(KubeApiError) as caught:
        kube_cluster.rest.create(doc, namespace=kube_namespace)
    assert caught.value.code == 422
    assert field in caught.value.message


def test_memory_policies_reach_the_launcher_env(
    kube_cluster: KubeTestCluster, kube_namespace: str, operator: KopfRunner
) -> None:
    ns = kube_namespace
    policies = {
        "replayMessages": 12,
        "replayTokens": 4000,
        "tokenCounter": "my_pkg.tokens:count",
        "redact": ["email", "card", "employee-id"],
        "summary": {"threshold": 60, "endpoint": "http://127.0.0.1:8081/summarize"},
    }
    kube_cluster.apply_manifests(manifest(ns, sessionMemory=policies))
    ksvc = wait_workload(kube_cluster, ns, lambda b: has_launcher(b) and env.REDACT in launcher_env(b), "policy env")
    variables = launcher_env(ksvc)
    assert variables[env.REDACT] == "email,card,employee-id"
    assert variables[env.SUMMARY_THRESHOLD] == "60"
    assert variables[env.SUMMARIZER_URL] == "http://127.0.0.1:8081/summarize"
    assert variables[env.REPLAY_MESSAGES] == "12"
    assert variables[env.REPLAY_TOKENS] == "4000"
    assert variables[env.TOKEN_COUNTER] == "my_pkg.tokens:count"
    first_hash = pod_template(ksvc)["metadata"]["annotations"][f"{kube.GROUP}/memory-wiring"]

    # Back to the defaults (the API server fills in tokenCounter: approx): the policy env goes, the hash moves.
    kube_cluster.apply_manifests(manifest(ns, sessionMemory={"scope": "session"}))
    plain = wait_workload(kube_cluster, ns, lambda b: env.REDACT not in launcher_env(b), "the policy env gone")
    assert not {env.TOKEN_COUNTER, env.SUMMARY_THRESHOLD, env.SUMMARIZER_URL, env.REPLAY_TOKENS} & set(
        launcher_env(plain)
    )
    assert (agent(kube_cluster, ns) or {})["spec"]["sessionMemory"]["tokenCounter"] == "approx"
    assert pod_template(plain)["metadata"]["annotations"][f"{kube.GROUP}/memory-wiring"] != first_hash
    wait_condition(kube_cluster, ns, "MemoryReady", "True", "Wired")


@pytest.mark.parametrize("threshold", [10, 12], ids=["below-replay-window", "equal-to-replay-window"])
def test_summary_threshold_within_the_replay_window_is_rejected(
    kube_cluster: KubeTestCluster, kube_namespace: str, threshold: int
) -> None:
    memory = {"replayMessages": 12, "summary": {"threshold": threshold}}
    doc = manifest(kube_namespace, name=f"summary-{threshold}", sessionMemory=memory)
    with pytest.raises(KubeApiError) as caught:
        kube_cluster.rest.create(doc, namespace=kube_namespace)
    assert caught.value.code == 422
    assert "spec.sessionMemory.summary.threshold" in caught.value.message
    assert "replayMessages" in caught.value.message
    # Past the window (and below the cap) the same spec is accepted.
    accepted = kube_cluster.rest.create(
        manifest(
            kube_namespace, name=f"summary-ok-{threshold}", sessionMemory={**memory, "summary": {"threshold": 13}}
        ),
        namespace=kube_namespace,
    )
    assert accepted["spec"]["sessionMemory"]["summary"] == {"threshold": 13, "endpoint": "builtin"}


def test_a_quota_is_accepted_and_kept(kube_cluster: KubeTestCluster, kube_namespace: str) -> None:
    quota = {"maxConversations": 1, "maxBytes": 1048576, "requestsPerSecond": 20}
    created = kube_cluster.rest.create(
        manifest(kube_namespace, sessionMemory={"quota": quota}), namespace=kube_namespace
    )
    assert created["spec"]["sessionMemory"]["quota"] == quota


def test_a_name_of_exactly_the_limit_is_accepted(kube_cluster: KubeTestCluster, kube_namespace: str) -> None:
    name = "a" * kube.MAX_AGENT_NAME
    doc = {"apiVersion": kube.API_VERSION, "kind": kube.AGENT_KIND, "metadata": {"name": name}, "spec": {"image": "x"}}
    created = kube_cluster.rest.create(doc, namespace=kube_namespace)
    assert created["spec"]["executionModel"] == "serving"


def test_deleting_the_agent_deployment_garbage_collects_everything(
    kube_cluster: KubeTestCluster, kube_namespace: str, operator: KopfRunner
) -> None:
    ns = kube_namespace
    sa_name = kube.agent_service_account("support-agent")
    kube_cluster.apply_manifests(manifest(ns))
    wait_workload(kube_cluster, ns, has_launcher, "the Knative Service")
    wait_for(lambda: get(kube_cluster, "v1", "ServiceAccount", sa_name, ns), "the ServiceAccount")
    assert not (agent(kube_cluster, ns) or {}).get("metadata", {}).get("finalizers")  # GC does the deleting

    kube_cluster.rest.delete(kube.API_VERSION, kube.AGENT_KIND, "support-agent", ns)
    wait_for(lambda: get(kube_cluster, KSVC, "Service", "support-agent", ns) is None, "the Knative Service to go")
    wait_for(lambda: get(kube_cluster, "v1", "ServiceAccount", sa_name, ns) is None, "the ServiceAccount to go")
    assert agent(kube_cluster, ns) is None


def test_deployment_model_gets_the_same_wiring(
    kube_cluster: KubeTestCluster, kube_namespace: str, operator: KopfRunner
) -> None:
    ns = kube_namespace
    kube_cluster.apply_manifests(manifest(ns, executionModel="deployment"))
    deployment = wait_workload(kube_cluster, ns, has_launcher, "the Deployment", "apps/v1", "Deployment")
    service = wait_for(lambda: get(kube_cluster, "v1", "Service", "support-agent", ns), "the Service")

    template = pod_template(deployment)
    assert template["spec"]["serviceAccountName"] == kube.agent_service_account("support-agent")
    assert launcher_env(deployment)[env.PROXY_URL] == PROXY_URL
    assert launcher_env(deployment)[env.SCOPE] == "session"
    token = template["spec"]["volumes"][0]["projected"]["sources"][0]["serviceAccountToken"]
    assert token["audience"] == AUDIENCE
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert service["spec"]["ports"][0]["targetPort"] == "http1"
    assert get(kube_cluster, KSVC, "Service", "support-agent", ns) is None
    body = wait_condition(kube_cluster, ns, "MemoryReady", "True", "Wired")
    assert body["status"]["workload"]["kind"] == "Deployment"
    # No Pods can start here (no nodes): the Deployment never becomes Available, and Ready says so.
    assert condition(body, "Ready").get("status") in ("Unknown", "False")

    # Switching to serving replaces the Deployment and Service by a Knative Service.
    kube_cluster.apply_manifests(manifest(ns, executionModel="serving"))
    wait_workload(kube_cluster, ns, has_launcher, "the Knative Service")
    wait_for(lambda: get(kube_cluster, "apps/v1", "Deployment", "support-agent", ns) is None, "the Deployment to go")
    wait_for(lambda: get(kube_cluster, "v1", "Service", "support-agent", ns) is None, "the Service to go")


def test_knative_ready_makes_the_agent_ready(
    kube_cluster: KubeTestCluster, kube_namespace: str, operator: KopfRunner
) -> None:
    ns = kube_namespace
    kube_cluster.apply_manifests(manifest(ns))
    ksvc = wait_workload(kube_cluster, ns, has_launcher, "the Knative Service")
    wait_condition(kube_cluster, ns, "Ready", "Unknown")

    # What Knative's controller would write once the revision is up.
    status = {
        "observedGeneration": ksvc["metadata"]["generation"],
        "url": f"http://support-agent.{ns}.example.com",
        "latestCreatedRevisionName": "support-agent-00001",
        "latestReadyRevisionName": "support-agent-00001",
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "ConfigurationsReady", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "RoutesReady", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ],
    }
    path = f"/apis/{KSVC}/namespaces/{ns}/services/support-agent/status"
    kube_cluster.rest.request("PATCH", path, body={"status": status}, content_type="application/merge-patch+json")

    body = wait_condition(kube_cluster, ns, "Ready", "True")
    assert body["status"]["url"] == f"http://support-agent.{ns}.example.com"
    assert body["status"]["latestRevision"] == "support-agent-00001"
    assert condition(body, "MemoryReady")["status"] == "True"

    # A spec change makes that Ready stale until Knative observes the new generation.
    kube_cluster.apply_manifests(manifest(ns, sessionMemory={"scope": "session", "replayMessages": 10}))
    wait_condition(kube_cluster, ns, "Ready", "Unknown", "Deploying")


def test_a_deleted_workload_is_recreated(
    kube_cluster: KubeTestCluster, kube_namespace: str, operator: KopfRunner
) -> None:
    ns = kube_namespace
    kube_cluster.apply_manifests(manifest(ns))
    first = wait_workload(kube_cluster, ns, has_launcher, "the Knative Service")
    wait_condition(kube_cluster, ns, "MemoryReady", "True")
    kube_cluster.rest.delete(KSVC, "Service", "support-agent", ns)
    again = wait_workload(
        kube_cluster, ns, lambda b: b["metadata"]["uid"] != first["metadata"]["uid"], "a re-created Knative Service"
    )
    assert has_launcher(again)


# ---- MemoryReady tells the truth (issue #20) ------------------------------------------------------------


def test_an_unknown_redactor_makes_memory_not_ready(
    kube_cluster: KubeTestCluster, kube_namespace: str, operator: KopfRunner
) -> None:
    ns = kube_namespace
    kube_cluster.apply_manifests(manifest(ns, sessionMemory={"redact": ["email", "badge-id"]}))
    body = wait_condition(kube_cluster, ns, "MemoryReady", "False", "UnknownRedactor")
    message = condition(body, "MemoryReady")["message"]
    assert "badge-id" in message and "proxy.redactPatterns" in message
    (event,) = wait_for(lambda: warning_events(kube_cluster, ns, "UnknownRedactor"), "the UnknownRedactor Event")
    assert "badge-id" in event["message"]

    # A name the proxy is configured with (the chart told the operator) is fine.
    kube_cluster.apply_manifests(manifest(ns, sessionMemory={"redact": ["email", KNOWN_CUSTOM_REDACTOR]}))
    wait_condition(kube_cluster, ns, "MemoryReady", "True", "Wired")


def test_per_user_without_a_capability_key_makes_memory_not_ready(
    kube_cluster: KubeTestCluster, kube_namespace: str, operator: KopfRunner
) -> None:
    ns = kube_namespace
    kube_cluster.apply_manifests(manifest(ns, sessionMemory={"perUser": True}))
    body = wait_condition(kube_cluster, ns, "MemoryReady", "False", "UserCapabilityKeyMissing")
    assert "proxy.capabilityKey.enabled" in condition(body, "MemoryReady")["message"]
    wait_for(lambda: warning_events(kube_cluster, ns, "UserCapabilityKeyMissing"), "the Warning Event")


def test_backend_addr_is_ignored_visibly(
    kube_cluster: KubeTestCluster, kube_namespace: str, operator: KopfRunner
) -> None:
    ns = kube_namespace
    kube_cluster.apply_manifests(manifest(ns, sessionMemory={"backend": {"addr": "valkey.elsewhere.svc:6379"}}))
    # The proxy path works, so memory is ready; the reason says the field is not honoured.
    body = wait_condition(kube_cluster, ns, "MemoryReady", "True", "BackendAddrIgnored")
    assert "valkey.elsewhere.svc:6379" in condition(body, "MemoryReady")["message"]
    wait_for(lambda: warning_events(kube_cluster, ns, "BackendAddrIgnored"), "the Warning Event")
    variables = launcher_env(wait_workload(kube_cluster, ns, has_launcher, "the Knative Service"))
    assert variables[env.PROXY_URL] == PROXY_URL
    assert env.BACKEND_ADDR not in variables


def test_drift_is_repaired_without_touching_the_agent(
    kube_cluster: KubeTestCluster, kube_namespace: str, operator: KopfRunner
) -> None:
    ns = kube_namespace
    sa_name = kube.agent_service_account("support-agent")
    kube_cluster.apply_manifests(manifest(ns))
    wait_condition(kube_cluster, ns, "MemoryReady", "True", "Wired")
    account = wait_for(lambda: get(kube_cluster, "v1", "ServiceAccount", sa_name, ns), "the ServiceAccount")

    kube_cluster.rest.delete("v1", "ServiceAccount", sa_name, ns)
    again = wait_for(
        lambda: (
            (found := get(kube_cluster, "v1", "ServiceAccount", sa_name, ns))
            and found["metadata"]["uid"] != account["metadata"]["uid"]
            and found
        ),
        "the ServiceAccount to come back",
        timeout=WAIT_SECONDS + 3 * RESYNC_SECONDS,
    )
    assert again["metadata"]["ownerReferences"][0]["name"] == "support-agent"

    # A hand edit of a field the operator owns is reverted too (the launcher's proxy URL here).
    ksvc = wait_workload(kube_cluster, ns, has_launcher, "the Knative Service")
    edited = copy.deepcopy(ksvc)
    for container in edited["spec"]["template"]["spec"]["containers"]:
        for variable in container.get("env", []):
            if variable["name"] == env.PROXY_URL:
                variable["value"] = "http://somewhere-else:1"
    edited["metadata"].pop("managedFields", None)
    path = f"/apis/{KSVC}/namespaces/{ns}/services/support-agent"
    kube_cluster.rest.request("PUT", path, body=edited)
    wait_workload(
        kube_cluster,
        ns,
        lambda b: launcher_env(b)[env.PROXY_URL] == PROXY_URL,
        "the hand edit reverted",
    )
    # The AgentDeployment itself was never changed: the periodic resync did the repairs.
    assert (agent(kube_cluster, ns) or {})["metadata"]["generation"] == 1


# ---- Names it does not own are never taken (issue #37) ---------------------------------------------------


def foreign_objects(namespace: str) -> dict[str, dict[str, Any]]:
    """Objects someone else made, each named like a child of one agent, keyed by that agent's name. The
    Service even carries the operator's labels: labels prove nothing."""
    theirs = {kube.LABEL_MANAGED_BY: kube.MANAGED_BY, kube.LABEL_AGENT: "svc-agent"}
    return {
        "svc-agent": {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "svc-agent", "namespace": namespace, "labels": theirs},
            "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 80, "targetPort": 9376, "protocol": "TCP"}]},
        },
        "ksvc-agent": {
            "apiVersion": KSVC,
            "kind": "Service",
            "metadata": {"name": "ksvc-agent", "namespace": namespace},
            "spec": {"template": {"spec": {"containers": [{"image": "registry.example/theirs:1"}]}}},
        },
        "sa-agent": {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": kube.agent_service_account("sa-agent"), "namespace": namespace},
            "automountServiceAccountToken": True,
        },
    }


def untouched(before: dict[str, Any], now: dict[str, Any] | None) -> None:
    """`now` is the object `before` was: same incarnation, same content, no owner, no write by the operator."""
    assert now is not None, f"{before['kind']} {before['metadata']['name']} was deleted"
    assert now["metadata"]["uid"] == before["metadata"]["uid"]
    assert "ownerReferences" not in now["metadata"]
    assert now["metadata"].get("labels") == before["metadata"].get("labels")
    for key in ("spec", "automountServiceAccountToken"):
        assert now.get(key) == before.get(key)
    managers = {entry.get("manager") for entry in now["metadata"].get("managedFields") or []}
    assert kube.MANAGED_BY not in managers


def fetch(cluster: KubeTestCluster, body: dict[str, Any]) -> dict[str, Any] | None:
    meta = body["metadata"]
    return get(cluster, body["apiVersion"], body["kind"], meta["name"], meta["namespace"])


def test_objects_it_does_not_own_survive_an_agent_of_their_name(
    kube_cluster: KubeTestCluster, kube_namespace: str, operator: KopfRunner
) -> None:
    ns = kube_namespace
    before = {
        agent_name: kube_cluster.rest.create(doc, namespace=ns) for agent_name, doc in foreign_objects(ns).items()
    }
    models = {"svc-agent": "deployment", "ksvc-agent": "serving", "sa-agent": "serving", "plain-agent": "serving"}
    for agent_name, model in models.items():
        kube_cluster.apply_manifests(manifest(ns, name=agent_name, executionModel=model))

    for agent_name, theirs in before.items():
        body = wait_condition(kube_cluster, ns, "Ready", "False", "NameConflict", name=agent_name)
        message = condition(body, "Ready")["message"]
        assert f'{theirs["kind"]} "{theirs["metadata"]["name"]}"' in message and "untouched" in message
        assert condition(body, "MemoryReady")["reason"] == "NameConflict"
        assert "workload" not in body["status"]
        (event,) = wait_for(partial(warning_events, kube_cluster, ns, "NameConflict", agent_name), "the Event")
        assert theirs["metadata"]["name"] in event["message"]
        untouched(theirs, fetch(kube_cluster, theirs))
    # Fail-closed: nothing at all was made for an agent with a taken name (no workload under their identity).
    assert get(kube_cluster, KSVC, "Service", "sa-agent", ns) is None
    assert get(kube_cluster, "apps/v1", "Deployment", "svc-agent", ns) is None
    assert get(kube_cluster, "v1", "ServiceAccount", kube.agent_service_account("ksvc-agent"), ns) is None
    plain_sa = kube.agent_service_account("plain-agent")
    wait_for(lambda: get(kube_cluster, "v1", "ServiceAccount", plain_sa, ns), "the free agent's ServiceAccount")

    for agent_name in models:
        kube_cluster.rest.delete(kube.API_VERSION, kube.AGENT_KIND, agent_name, ns)
    # The free agent's children being collected shows the garbage collector has seen the deletions.
    wait_for(lambda: get(kube_cluster, KSVC, "Service", "plain-agent", ns) is None, "plain-agent's Knative Service")
    wait_for(lambda: get(kube_cluster, "v1", "ServiceAccount", plain_sa, ns) is None, "plain-agent's ServiceAccount")
    for agent_name, theirs in before.items():
        assert agent(kube_cluster, ns, agent_name) is None
        untouched(theirs, fetch(kube_cluster, theirs))


def test_an_agent_whose_name_is_freed_is_set_up(
    kube_cluster: KubeTestCluster, kube_namespace: str, operator: KopfRunner
) -> None:
    ns = kube_namespace
    sa_name = kube.agent_service_account("support-agent")
    theirs = kube_cluster.create_service_account(ns, sa_name)
    kube_cluster.apply_manifests(manifest(ns))
    wait_condition(kube_cluster, ns, "MemoryReady", "False", "NameConflict")
    assert get(kube_cluster, KSVC, "Service", "support-agent", ns) is None

    kube_cluster.rest.delete("v1", "ServiceAccount", sa_name, ns)
    body = wait_condition(kube_cluster, ns, "MemoryReady", "True", "Wired")
    assert condition(body, "Ready")["reason"] != "NameConflict"
    account = wait_for(lambda: get(kube_cluster, "v1", "ServiceAccount", sa_name, ns), "the agent's ServiceAccount")
    assert account["metadata"]["uid"] != theirs["metadata"]["uid"]
    assert account["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
    wait_workload(kube_cluster, ns, has_launcher, "the Knative Service")


async def test_an_apply_lands_only_on_the_object_judged_ours(
    kube_cluster: KubeTestCluster, kube_namespace: str, kube_env: dict[str, str]
) -> None:
    """The guard against a race between the ownership check and the write: a create never lands on an
    object made meanwhile, an update never on a replacement; and a created object is the operator's
    apply entry's, so a field it stops rendering goes."""
    ns = kube_namespace

    def account(**labels: str) -> dict[str, Any]:
        meta = {"name": "pinned", "namespace": ns, "labels": labels}
        return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta, "automountServiceAccountToken": False}

    api = await KubeApi.connect()
    try:
        created = await api.apply(account(step="created", extra="x"), uid=None)
        (entry,) = created["metadata"]["managedFields"]
        assert (entry["manager"], entry["operation"]) == (kube.MANAGED_BY, "Apply")
        with pytest.raises(KubeError) as caught:
            await api.apply(account(step="taken-over"), uid=None)
        assert (caught.value.status, caught.value.reason) == (409, "AlreadyExists")
        updated = await api.apply(account(step="updated"), uid=created["metadata"]["uid"])
        assert updated["metadata"]["labels"] == {"step": "updated"}  # "extra" is no longer rendered: gone

        kube_cluster.rest.delete("v1", "ServiceAccount", "pinned", ns)
        replacement = kube_cluster.rest.create(account(step="theirs"), namespace=ns)
        with pytest.raises(KubeError) as refused:
            await api.apply(account(step="taken-over"), uid=created["metadata"]["uid"])
        assert refused.value.status == 422
        now = get(kube_cluster, "v1", "ServiceAccount", "pinned", ns) or {}
        assert now["metadata"]["uid"] == replacement["metadata"]["uid"]
        assert now["metadata"]["labels"] == {"step": "theirs"}
        assert "ownerReferences" not in now["metadata"]
    finally:
        await api.close()


# ---- Pod Security `restricted` (issue #37) ---------------------------------------------------------------


def restricted_pod(cluster: KubeTestCluster, namespace: str, name: str, template: dict[str, Any]) -> dict[str, Any]:
    """A Pod with the workload's pod template, created in `namespace`: the API server's PodSecurity
    admission judges it (no kubelet needed)."""
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}}
    return cluster.rest.create({**body, "spec": template["spec"]}, namespace=namespace)


@pytest.mark.parametrize("model", ["serving", "deployment"])
def test_agent_pods_pass_pod_security_restricted(
    kube_cluster: KubeTestCluster, kube_namespace: str, operator: KopfRunner, model: str
) -> None:
    ns = kube_namespace
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    kube_cluster.rest.request(
        "PATCH", f"/api/v1/namespaces/{ns}", body={"metadata": {"labels": labels}}, content_type=_MERGE_PATCH
    )
    api_version, kind = (KSVC, "Service") if model == "serving" else ("apps/v1", "Deployment")
    kube_cluster.apply_manifests(manifest(ns, executionModel=model))
    workload = wait_workload(kube_cluster, ns, has_launcher, "the wired workload", api_version, kind)
    created = restricted_pod(kube_cluster, ns, "as-rendered", pod_template(workload))
    assert created["metadata"]["name"] == "as-rendered"

    # An agent that says it must run as root gets exactly that, and a restricted namespace refuses it.
    kube_cluster.apply_manifests(manifest(ns, executionModel=model, securityContext={"runAsNonRoot": False}))
    root = wait_workload(
        kube_cluster,
        ns,
        lambda b: containers(b)["agent"]["securityContext"]["runAsNonRoot"] is False,
        "the agent's own security context",
        api_version,
        kind,
    )
    assert containers(root)["sessionmem-launcher"]["securityContext"]["runAsNonRoot"] is True
    with pytest.raises(KubeApiError) as refused:
        restricted_pod(kube_cluster, ns, "as-root", pod_template(root))
    assert refused.value.code == 403 and "runAsNonRoot" in refused.value.message


@pytest.mark.parametrize("model", ["serving", "deployment"])
def test_resources_pull_secrets_placement_and_secret_env_reach_the_workload(
    kube_cluster: KubeTestCluster, kube_namespace: str, operator: KopfRunner, model: str
) -> None:
    ns = kube_namespace
    fields: dict[str, Any] = {
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        "imagePullSecrets": [{"name": "registry-creds"}],
        "nodeSelector": {"kubernetes.io/arch": "arm64"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "envFrom": [{"secretRef": {"name": "agent-api-keys"}}],
    }
    api_version, kind = (KSVC, "Service") if model == "serving" else ("apps/v1", "Deployment")
    kube_cluster.apply_manifests(manifest(ns, executionModel=model, **copy.deepcopy(fields)))
    workload = wait_workload(kube_cluster, ns, has_launcher, "the wired workload", api_version, kind)
    pod = pod_template(workload)["spec"]
    agent_container = containers(workload)["agent"]
    assert agent_container["resources"] == fields["resources"]
    assert agent_container["envFrom"] == fields["envFrom"]
    assert (pod["imagePullSecrets"], pod["nodeSelector"]) == (fields["imagePullSecrets"], fields["nodeSelector"])
    assert pod["tolerations"] == fields["tolerations"]
    wait_condition(kube_cluster, ns, "MemoryReady", "True", "Wired")

    # Dropped from the AgentDeployment, they leave the workload (the operator owns what it rendered).
    kube_cluster.apply_manifests(manifest(ns, executionModel=model))
    bare = wait_workload(
        kube_cluster, ns, lambda b: "nodeSelector" not in pod_template(b)["spec"], "the fields gone", api_version, kind
    )
    assert not {"imagePullSecrets", "tolerations"} & set(pod_template(bare)["spec"])
    assert "envFrom" not in containers(bare)["agent"]


def test_switching_to_deployment_waits_for_knatives_route_service_and_then_takes_over(
    kube_cluster: KubeTestCluster, kube_namespace: str, operator: KopfRunner
) -> None:
    """Knative's route Service has the agent's name; it is the Route's, the Route the Knative Service's.
    After a switch to deployment the operator deletes its Knative Service, the garbage collector the rest,
    and the name is free for the agent's own Service."""
    ns = kube_namespace
    kube_cluster.apply_manifests(manifest(ns))
    ksvc = wait_workload(kube_cluster, ns, has_launcher, "the Knative Service")
    owner = {"controller": True, "blockOwnerDeletion": False}
    by_ksvc = {**owner, "apiVersion": KSVC, "kind": "Service", "name": "support-agent", "uid": ksvc["metadata"]["uid"]}
    route = kube_cluster.rest.create(
        {
            "apiVersion": KSVC,
            "kind": "Route",
            "metadata": {"name": "support-agent", "namespace": ns, "ownerReferences": [by_ksvc]},
            "spec": {},
        },
        namespace=ns,
    )
    by_route = {**owner, "apiVersion": KSVC, "kind": "Route", "name": "support-agent", "uid": route["metadata"]["uid"]}
    kube_cluster.rest.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "support-agent", "namespace": ns, "ownerReferences": [by_route]},
            "spec": {"type": "ExternalName", "externalName": "kourier-internal.kourier-system.svc.cluster.local"},
        },
        namespace=ns,
    )

    kube_cluster.apply_manifests(manifest(ns, executionModel="deployment"))
    wait_workload(kube_cluster, ns, has_launcher, "the Deployment", "apps/v1", "Deployment")
    service = wait_for(
        lambda: (
            (found := get(kube_cluster, "v1", "Service", "support-agent", ns))
            and found["spec"].get("type") != "ExternalName"
            and found
        ),
        "the agent's own Service",
        timeout=WAIT_SECONDS + 3 * RESYNC_SECONDS,
    )
    assert service["metadata"]["ownerReferences"][0]["kind"] == kube.AGENT_KIND
    assert get(kube_cluster, KSVC, "Service", "support-agent", ns) is None
    body = wait_condition(kube_cluster, ns, "MemoryReady", "True", "Wired")
    assert body["status"]["workload"]["kind"] == "Deployment"
