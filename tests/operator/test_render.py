"""Rendering (pure): AgentDeployment -> ServiceAccount + Knative Service, or Deployment + Service."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from sessionmem_core import env, kube
from sessionmem_operator import crds
from sessionmem_operator.config import OperatorConfig
from sessionmem_operator.render import AGENT_CONTAINER, WIRING_ANNOTATION, ObjectRef, Rendered, render
from sessionmem_operator.spec import AgentSpec, parse_agent
from sessionmem_operator.wiring import LAUNCHER_CONTAINER, TOKEN_VOLUME, resolve_memory

REPO = Path(__file__).resolve().parents[2]
PROXY = OperatorConfig(proxy_url="http://proxy.sessionmem.svc:8000", launcher_image="reg.example/launcher:1")
NO_PROXY = OperatorConfig(launcher_image="reg.example/launcher:1")
UID = "0b9d7c1e-0000-4000-8000-000000000001"


def design_manifest() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REPO / "examples" / "support-agent.yaml").read_text(encoding="utf-8"))
    return loaded


def as_stored(manifest: dict[str, Any], generation: int = 1) -> dict[str, Any]:
    """The object as the API server stores it: defaulted, with a uid and a generation."""
    schema = crds.agent_deployment_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    body: dict[str, Any] = crds.apply_defaults(schema, copy.deepcopy(manifest))
    body["metadata"] = {**body["metadata"], "uid": UID, "generation": generation}
    return body


def agent_from(manifest: dict[str, Any]) -> AgentSpec:
    return parse_agent(as_stored(manifest))


def rendered(
    manifest: dict[str, Any], config: OperatorConfig = PROXY, registries: tuple[str, ...] = ()
) -> tuple[Rendered, AgentSpec]:
    agent = agent_from(manifest)
    return render(agent, resolve_memory(agent, registries, config), config), agent


def by_kind(result: Rendered) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["apiVersion"], m["kind"]): m for m in result.objects}


def containers(pod_spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod_spec["containers"]}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", [])}


def test_design_manifest_renders_a_knative_service_with_the_launcher_sidecar() -> None:
    result, _ = rendered(design_manifest())
    objects = by_kind(result)
    assert list(objects) == [("v1", "ServiceAccount"), ("serving.knative.dev/v1", "Service")]
    assert result.workload == ObjectRef("serving.knative.dev/v1", "Service", "support-agent")

    ksvc = objects[("serving.knative.dev/v1", "Service")]
    assert ksvc["metadata"]["name"] == "support-agent"
    assert ksvc["metadata"]["namespace"] == "my-team"
    template = ksvc["spec"]["template"]
    pod = template["spec"]
    assert pod["serviceAccountName"] == kube.agent_service_account("support-agent")
    assert WIRING_ANNOTATION in template["metadata"]["annotations"]

    launcher = containers(pod)[LAUNCHER_CONTAINER]
    assert launcher["image"] == "reg.example/launcher:1"
    assert launcher["command"] == ["python", "-m", "sessionmem_launcher"]
    assert launcher["ports"] == [{"name": "http1", "containerPort": env.DEFAULT_SERVE_PORT, "protocol": "TCP"}]
    assert env_of(launcher) == {
        env.NAMESPACE: "my-team",
        env.AGENT: "support-agent",
        env.SCOPE: "session",
        env.PER_USER: "false",
        env.REPLAY_MESSAGES: "40",
        env.CAP: "500",
        env.TTL_SECONDS: str(24 * 3600),
        env.LAUNCHER_PORT: str(env.DEFAULT_LAUNCHER_PORT),
        env.SERVE_PORT: str(env.DEFAULT_SERVE_PORT),
        env.AGENT_PORT: str(env.DEFAULT_AGENT_PORT),
        env.PROXY_URL: "http://proxy.sessionmem.svc:8000",
        env.TOKEN_PATH: env.DEFAULT_TOKEN_PATH,
    }
    # Knative rejects valueFrom: every variable is a static value.
    assert all(set(item) == {"name", "value"} for item in launcher["env"])

    agent = containers(pod)[AGENT_CONTAINER]
    assert agent["image"] == "ghcr.io/my-org/support-agent:1.4.0"
    assert "ports" not in agent  # Knative routes to the one container with a port: the launcher
    assert env_of(agent) == {env.AGENT_PORT: "8081", env.LAUNCHER_PORT: "2998", "PORT": "8081"}
    assert "volumeMounts" not in agent  # the token is the launcher's alone


def test_projected_token_volume_has_the_configured_audience_and_is_mounted_read_only() -> None:
    config = OperatorConfig(proxy_url="http://p:8000", audience="custom-aud", token_expiration_seconds=900)
    result, _ = rendered(design_manifest(), config)
    pod = by_kind(result)[("serving.knative.dev/v1", "Service")]["spec"]["template"]["spec"]
    (volume,) = pod["volumes"]
    assert volume["name"] == TOKEN_VOLUME
    (source,) = volume["projected"]["sources"]
    assert source == {"serviceAccountToken": {"audience": "custom-aud", "expirationSeconds": 900, "path": "token"}}
    (mount,) = containers(pod)[LAUNCHER_CONTAINER]["volumeMounts"]
    assert mount == {"name": TOKEN_VOLUME, "mountPath": "/var/run/secrets/sessionmem", "readOnly": True}
    assert env_of(containers(pod)[LAUNCHER_CONTAINER])[env.TOKEN_PATH] == f"{mount['mountPath']}/token"


def test_service_account_is_owned_labelled_and_without_api_token() -> None:
    result, _ = rendered(design_manifest())
    account = by_kind(result)[("v1", "ServiceAccount")]
    assert account["metadata"]["name"] == "sessionmem-support-agent"
    assert account["automountServiceAccountToken"] is False
    assert account["metadata"]["labels"] == {
        kube.LABEL_MANAGED_BY: kube.MANAGED_BY,
        kube.LABEL_AGENT: "support-agent",
    }


def test_everything_is_controlled_by_the_agent_deployment() -> None:
    for model in ("serving", "deployment"):
        manifest = design_manifest()
        manifest["spec"]["executionModel"] = model
        result, _ = rendered(manifest)
        for obj in result.objects:
            assert obj["metadata"]["ownerReferences"] == [
                {
                    "apiVersion": kube.API_VERSION,
                    "kind": kube.AGENT_KIND,
                    "name": "support-agent",
                    "uid": UID,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]


def test_without_session_memory_the_agent_serves_alone() -> None:
    manifest = design_manifest()
    del manifest["spec"]["sessionMemory"]
    result, _ = rendered(manifest)
    template = by_kind(result)[("serving.knative.dev/v1", "Service")]["spec"]["template"]
    pod = template["spec"]
    assert list(containers(pod)) == [AGENT_CONTAINER]
    assert containers(pod)[AGENT_CONTAINER]["ports"] == [{"name": "http1", "containerPort": 8080, "protocol": "TCP"}]
    assert "env" not in containers(pod)[AGENT_CONTAINER]  # Knative sets $PORT for the serving container
    assert "volumes" not in pod
    assert "annotations" not in template["metadata"]
    assert result.wiring_hash is None
    # Still its own identity, so it never runs as the namespace's default ServiceAccount.
    assert pod["serviceAccountName"] == "sessionmem-support-agent"


def test_toggling_or_rescoping_memory_changes_the_pod_template() -> None:
    with_memory, _ = rendered(design_manifest())
    manifest = design_manifest()
    del manifest["spec"]["sessionMemory"]
    without, _ = rendered(manifest)
    manifest = design_manifest()
    manifest["spec"]["sessionMemory"]["scope"] = "shared"
    shared, _ = rendered(manifest, registries=("support-team",))

    def template(result: Rendered) -> dict[str, Any]:
        template: dict[str, Any] = by_kind(result)[("serving.knative.dev/v1", "Service")]["spec"]["template"]
        return template

    assert template(with_memory) != template(without)
    assert template(with_memory) != template(shared)
    assert with_memory.wiring_hash != shared.wiring_hash
    launcher = containers(template(shared)["spec"])[LAUNCHER_CONTAINER]
    assert env_of(launcher)[env.SCOPE] == "shared"
    assert env_of(launcher)[env.REGISTRY] == "support-team"


def test_rendering_is_deterministic() -> None:
    first, _ = rendered(design_manifest())
    second, _ = rendered(design_manifest())
    assert first == second


def test_deployment_model_gets_the_same_wiring_on_a_deployment_and_service() -> None:
    manifest = design_manifest()
    manifest["spec"]["executionModel"] = "deployment"
    result, _ = rendered(manifest)
    objects = by_kind(result)
    assert list(objects) == [("v1", "ServiceAccount"), ("apps/v1", "Deployment"), ("v1", "Service")]
    assert result.workload == ObjectRef("apps/v1", "Deployment", "support-agent")
    assert result.stale == (ObjectRef("serving.knative.dev/v1", "Service", "support-agent"),)

    serving, _ = rendered(design_manifest())
    knative_template = by_kind(serving)[("serving.knative.dev/v1", "Service")]["spec"]["template"]
    deployment = objects[("apps/v1", "Deployment")]
    assert deployment["spec"]["template"] == knative_template
    assert "replicas" not in deployment["spec"]  # left to `kubectl scale` / an HPA
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()

    service = objects[("v1", "Service")]
    assert service["spec"]["selector"] == selector
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http1", "protocol": "TCP"}]


def test_plain_deployment_without_memory_gets_the_port_env_knative_would_give() -> None:
    manifest = design_manifest()
    manifest["spec"]["executionModel"] = "deployment"
    manifest["spec"]["port"] = 3000
    del manifest["spec"]["sessionMemory"]
    result, _ = rendered(manifest)
    agent = containers(by_kind(result)[("apps/v1", "Deployment")]["spec"]["template"]["spec"])[AGENT_CONTAINER]
    assert agent["ports"][0]["containerPort"] == 3000
    assert env_of(agent) == {"PORT": "3000"}


def test_custom_agent_port_sits_behind_the_launcher() -> None:
    manifest = design_manifest()
    manifest["spec"]["port"] = 3000
    manifest["spec"]["env"] = [{"name": "LOG_LEVEL", "value": "debug"}]
    result, _ = rendered(manifest)
    pod = by_kind(result)[("serving.knative.dev/v1", "Service")]["spec"]["template"]["spec"]
    assert env_of(containers(pod)[LAUNCHER_CONTAINER])[env.AGENT_PORT] == "3000"
    assert env_of(containers(pod)[AGENT_CONTAINER]) == {
        "LOG_LEVEL": "debug",
        env.AGENT_PORT: "3000",
        env.LAUNCHER_PORT: "2998",
        "PORT": "3000",
    }


def test_without_a_proxy_url_no_launcher_is_injected() -> None:
    """No direct mode: without a proxy the agent serves alone, and MemoryReady says why (wiring tests)."""
    result, _ = rendered(design_manifest(), NO_PROXY)
    pod = by_kind(result)[("serving.knative.dev/v1", "Service")]["spec"]["template"]["spec"]
    assert set(containers(pod)) == {AGENT_CONTAINER}
    assert "volumes" not in pod
    assert result.wiring_hash is None


def test_with_a_proxy_the_backend_address_is_the_proxys_concern() -> None:
    manifest = design_manifest()
    manifest["spec"]["sessionMemory"]["backend"] = {"addr": "valkey.team.svc:6379"}
    result, _ = rendered(manifest, PROXY)
    pod = by_kind(result)[("serving.knative.dev/v1", "Service")]["spec"]["template"]["spec"]
    launcher = env_of(containers(pod)[LAUNCHER_CONTAINER])
    assert env.BACKEND_ADDR not in launcher
    assert launcher[env.PROXY_URL] == PROXY.proxy_url


def test_memory_settings_reach_the_launcher_env() -> None:
    manifest = design_manifest()
    manifest["spec"]["sessionMemory"].update(
        {"perUser": True, "replayMessages": 12, "replayTokens": 4000, "maxEntries": 80, "ttl": "1h30m"}
    )
    result, _ = rendered(manifest)
    pod = by_kind(result)[("serving.knative.dev/v1", "Service")]["spec"]["template"]["spec"]
    launcher_env = env_of(containers(pod)[LAUNCHER_CONTAINER])
    assert launcher_env[env.PER_USER] == "true"
    assert launcher_env[env.REPLAY_MESSAGES] == "12"
    assert launcher_env[env.REPLAY_TOKENS] == "4000"
    assert launcher_env[env.CAP] == "80"
    assert launcher_env[env.TTL_SECONDS] == str(5400)


def test_launcher_env_is_what_the_launcher_settings_parse() -> None:
    result, _ = rendered(design_manifest())
    pod = by_kind(result)[("serving.knative.dev/v1", "Service")]["spec"]["template"]["spec"]
    settings = env.LauncherSettings.from_env(env_of(containers(pod)[LAUNCHER_CONTAINER]))
    assert (settings.namespace, settings.agent, settings.scope) == ("my-team", "support-agent", "session")
    assert (settings.serve_port, settings.launcher_port, settings.agent_port) == (8080, 2998, 8081)
    assert settings.token_path == env.DEFAULT_TOKEN_PATH
    assert settings.proxy_url == "http://proxy.sessionmem.svc:8000"


POLICIES: dict[str, Any] = {
    "replayMessages": 12,
    "replayTokens": 4000,
    "tokenCounter": "my_pkg.tokens:count",
    "redact": ["email", "card", "employee-id"],
    "summary": {"threshold": 60, "endpoint": "http://127.0.0.1:8081/summarize"},
}


def launcher_env_for(memory: dict[str, Any], config: OperatorConfig = PROXY) -> dict[str, str]:
    manifest = design_manifest()
    manifest["spec"]["sessionMemory"] = memory
    result, _ = rendered(manifest, config)
    pod = by_kind(result)[("serving.knative.dev/v1", "Service")]["spec"]["template"]["spec"]
    return env_of(containers(pod)[LAUNCHER_CONTAINER])


def test_memory_policies_reach_the_launcher_env_and_parse_back() -> None:
    variables = launcher_env_for(copy.deepcopy(POLICIES))
    assert variables[env.REPLAY_TOKENS] == "4000"
    assert variables[env.TOKEN_COUNTER] == "my_pkg.tokens:count"
    assert variables[env.REDACT] == "email,card,employee-id"
    assert variables[env.SUMMARY_THRESHOLD] == "60"
    assert variables[env.SUMMARIZER_URL] == "http://127.0.0.1:8081/summarize"
    settings = env.LauncherSettings.from_env(variables)
    assert settings.redact == ("email", "card", "employee-id")
    assert (settings.summary_threshold, settings.summarizer_url) == (60, "http://127.0.0.1:8081/summarize")
    assert (settings.replay_tokens, settings.token_counter) == (4000, "my_pkg.tokens:count")


def test_default_policies_add_no_env() -> None:
    """An object defaulted by this CRD (tokenCounter: approx, no redact, no summary) keeps the template it
    had before these fields existed: upgrading the operator rolls no revision."""
    variables = launcher_env_for({"tokenCounter": "approx", "redact": []})
    assert not {env.TOKEN_COUNTER, env.REDACT, env.SUMMARY_THRESHOLD, env.SUMMARIZER_URL} & set(variables)
    before, _ = rendered(design_manifest())
    manifest = design_manifest()
    manifest["spec"]["sessionMemory"].update({"tokenCounter": "approx", "redact": []})
    after, _ = rendered(manifest)
    assert before.wiring_hash == after.wiring_hash


def test_summary_without_threshold_is_off_but_its_endpoint_is_still_visible() -> None:
    variables = launcher_env_for({"summary": {"endpoint": "http://127.0.0.1:8081/summarize"}})
    assert env.SUMMARY_THRESHOLD not in variables
    assert variables[env.SUMMARIZER_URL] == "http://127.0.0.1:8081/summarize"
    assert env.LauncherSettings.from_env(variables).summary_threshold == 0  # off
    variables = launcher_env_for({"summary": {"threshold": 50}})
    assert (variables[env.SUMMARY_THRESHOLD], variables[env.SUMMARIZER_URL]) == ("50", "builtin")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("redact", ["email", "card"]),
        ("redact", ["email", "card", "phone"]),
        ("summary", {"threshold": 61, "endpoint": "http://127.0.0.1:8081/summarize"}),
        ("summary", {"threshold": 60, "endpoint": "builtin"}),
        ("summary", {"endpoint": "http://127.0.0.1:8081/summarize"}),
        ("tokenCounter", "approx"),
        ("tokenCounter", "other.tokens:count"),
        ("replayTokens", 4001),
    ],
)
def test_changing_any_policy_changes_the_pod_template(field: str, value: Any) -> None:
    def render_with(memory: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        manifest = design_manifest()
        manifest["spec"]["sessionMemory"] = memory
        result, _ = rendered(manifest)
        template: dict[str, Any] = by_kind(result)[("serving.knative.dev/v1", "Service")]["spec"]["template"]
        return template, result.wiring_hash

    base_template, base_hash = render_with(copy.deepcopy(POLICIES))
    changed_template, changed_hash = render_with({**copy.deepcopy(POLICIES), field: value})
    assert changed_template != base_template
    assert changed_hash != base_hash
    assert changed_template["metadata"]["annotations"][WIRING_ANNOTATION] == changed_hash


def test_the_launchers_otlp_endpoint_is_rendered_only_when_configured() -> None:
    traced = OperatorConfig(
        proxy_url=PROXY.proxy_url,
        launcher_image=PROXY.launcher_image,
        launcher_otlp_endpoint="http://collector.obs.svc:4318",
    )
    assert env.OTEL_EXPORTER_OTLP_ENDPOINT not in launcher_env_for(copy.deepcopy(POLICIES))
    traced_env = launcher_env_for(copy.deepcopy(POLICIES), traced)
    assert traced_env[env.OTEL_EXPORTER_OTLP_ENDPOINT] == "http://collector.obs.svc:4318"


def test_launcher_limits_are_rendered_only_when_configured() -> None:
    limited = OperatorConfig(
        proxy_url=PROXY.proxy_url, launcher_image=PROXY.launcher_image, launcher_limits=((env.MAX_URL_BYTES, "2048"),)
    )
    plain = launcher_env_for(copy.deepcopy(POLICIES))
    assert env.MAX_URL_BYTES not in plain
    assert launcher_env_for(copy.deepcopy(POLICIES), limited)[env.MAX_URL_BYTES] == "2048"


# ---- Pod Security `restricted` (issue #37) ---------------------------------------------------------------


def pod_of(manifest: dict[str, Any]) -> dict[str, Any]:
    result, _ = rendered(manifest)
    workload = next(m for m in result.objects if m["kind"] in ("Service", "Deployment") and "template" in m["spec"])
    pod: dict[str, Any] = workload["spec"]["template"]["spec"]
    return pod


@pytest.mark.parametrize("model", ["serving", "deployment"])
def test_both_containers_run_restricted_by_default_and_the_launchers_root_is_read_only(model: str) -> None:
    manifest = design_manifest()
    manifest["spec"]["executionModel"] = model
    pods = containers(pod_of(manifest))
    for name in (LAUNCHER_CONTAINER, AGENT_CONTAINER):
        context = pods[name]["securityContext"]
        assert context["allowPrivilegeEscalation"] is False and context["runAsNonRoot"] is True
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pods[LAUNCHER_CONTAINER]["securityContext"]["readOnlyRootFilesystem"] is True
    assert "readOnlyRootFilesystem" not in pods[AGENT_CONTAINER]["securityContext"]  # the agent may write


def test_the_agents_security_context_replaces_defaults_field_by_field_never_the_launchers() -> None:
    manifest = design_manifest()
    manifest["spec"]["securityContext"] = {"runAsNonRoot": False, "capabilities": {"add": ["NET_BIND_SERVICE"]}}
    pods = containers(pod_of(manifest))
    agent = pods[AGENT_CONTAINER]["securityContext"]
    assert agent["runAsNonRoot"] is False and agent["capabilities"] == {"add": ["NET_BIND_SERVICE"]}
    assert agent["allowPrivilegeEscalation"] is False  # not overridden: still the default
    launcher = pods[LAUNCHER_CONTAINER]["securityContext"]
    assert launcher["runAsNonRoot"] is True and launcher["capabilities"] == {"drop": ["ALL"]}
    # Without memory the agent container stands alone, with the same defaults.
    bare = design_manifest()
    del bare["spec"]["sessionMemory"]
    assert containers(pod_of(bare))[AGENT_CONTAINER]["securityContext"]["runAsNonRoot"] is True


RUN_FIELDS: dict[str, Any] = {
    "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
    "imagePullSecrets": [{"name": "registry-creds"}],
    "nodeSelector": {"kubernetes.io/arch": "arm64"},
    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "envFrom": [{"secretRef": {"name": "agent-api-keys"}}],
}


@pytest.mark.parametrize("model", ["serving", "deployment"])
@pytest.mark.parametrize("memory", [True, False], ids=["with-memory", "without-memory"])
def test_what_a_real_agent_needs_reaches_its_pod(model: str, memory: bool) -> None:
    manifest = design_manifest()
    manifest["spec"].update(copy.deepcopy(RUN_FIELDS), executionModel=model)
    if not memory:
        del manifest["spec"]["sessionMemory"]
    pod = pod_of(manifest)
    agent = containers(pod)[AGENT_CONTAINER]
    assert agent["resources"] == RUN_FIELDS["resources"]
    assert agent["envFrom"] == RUN_FIELDS["envFrom"]
    for field in ("imagePullSecrets", "nodeSelector", "tolerations"):
        assert pod[field] == RUN_FIELDS[field]
    if memory:  # the launcher keeps its own resources and never sees the agent's Secrets
        launcher = containers(pod)[LAUNCHER_CONTAINER]
        assert "envFrom" not in launcher and launcher["resources"] == {
            section: dict(values) for section, values in PROXY.launcher_resources.items()
        }
    plain = pod_of(design_manifest())
    assert not {"imagePullSecrets", "nodeSelector", "tolerations"} & set(plain)
    assert not {"resources", "envFrom"} & set(containers(plain)[AGENT_CONTAINER])
