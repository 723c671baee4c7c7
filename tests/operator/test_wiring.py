"""Memory resolution: the scope in effect, and why it differs from the request."""

from __future__ import annotations

from sessionmem_core.keys import Scope
from sessionmem_operator.config import OperatorConfig
from sessionmem_operator.spec import AgentSpec, MemorySpec
from sessionmem_operator.wiring import MemoryReason, resolve_memory

CONFIG = OperatorConfig(proxy_url="http://proxy:8000")


def agent(memory: MemorySpec | None) -> AgentSpec:
    return AgentSpec(namespace="my-team", name="support-agent", uid="u", generation=1, image="img", memory=memory)


def test_disabled_without_session_memory() -> None:
    resolution = resolve_memory(agent(None), (), CONFIG)
    assert resolution.reason is MemoryReason.DISABLED
    assert not resolution.enabled and not resolution.ready and not resolution.warning
    assert resolution.scope is None and resolution.key_prefix is None


def test_session_scope_uses_the_private_prefix() -> None:
    resolution = resolve_memory(agent(MemorySpec()), ("ignored-registry",), CONFIG)
    assert resolution.ready
    assert resolution.scope is Scope.SESSION
    assert resolution.key_prefix == "mem:my-team/support-agent:"
    assert resolution.registry is None
    assert "mem:my-team/support-agent:" in resolution.message


def test_shared_scope_for_a_member_uses_the_registry_prefix() -> None:
    resolution = resolve_memory(agent(MemorySpec(scope=Scope.SHARED)), ("support-team",), CONFIG)
    assert resolution.ready
    assert resolution.scope is Scope.SHARED
    assert resolution.registry == "support-team"
    assert resolution.key_prefix == "mem:shared:support-team:"


def test_shared_scope_on_a_non_member_keeps_the_private_layout() -> None:
    resolution = resolve_memory(agent(MemorySpec(scope=Scope.SHARED)), (), CONFIG)
    assert resolution.reason is MemoryReason.NOT_A_REGISTRY_MEMBER
    assert not resolution.ready and resolution.warning
    assert resolution.scope is Scope.SESSION
    assert resolution.key_prefix == "mem:my-team/support-agent:"
    assert resolution.registry is None
    assert "no AgentRegistry lists my-team/support-agent" in resolution.message


def test_shared_scope_listed_by_two_registries_is_ambiguous() -> None:
    resolution = resolve_memory(agent(MemorySpec(scope=Scope.SHARED)), ("a-team", "b-team"), CONFIG)
    assert resolution.reason is MemoryReason.AMBIGUOUS_REGISTRY
    assert resolution.warning
    assert resolution.scope is Scope.SESSION
    assert "a-team, b-team" in resolution.message


def test_message_says_where_memory_lives() -> None:
    resolution = resolve_memory(agent(MemorySpec()), (), CONFIG)
    assert resolution.reason is MemoryReason.WIRED and resolution.ready and not resolution.warning
    assert "proxy http://proxy:8000" in resolution.message


def test_backend_addr_is_ignored_visibly_while_the_proxy_path_works() -> None:
    resolution = resolve_memory(agent(MemorySpec(backend_addr="v:6379")), (), CONFIG)
    assert resolution.reason is MemoryReason.BACKEND_ADDR_IGNORED
    assert resolution.ready  # the proxy path works: memory calls succeed
    assert resolution.warning
    assert "backend.addr (v:6379) is ignored" in resolution.message
    assert [f.reason for f in resolution.findings] == [MemoryReason.BACKEND_ADDR_IGNORED]


def test_without_a_proxy_url_memory_is_off_and_the_chart_value_is_named() -> None:
    resolution = resolve_memory(agent(MemorySpec(backend_addr="v:6379")), (), OperatorConfig())
    assert resolution.reason is MemoryReason.NO_PROXY_CONFIGURED
    assert not resolution.ready and not resolution.enabled and resolution.warning
    assert "operator.proxyUrl" in resolution.message
    assert resolution.key_prefix is None


def test_an_unknown_redactor_blocks_and_names_the_chart_value() -> None:
    memory = MemorySpec(redact=("email", "employee-id", "badge"))
    resolution = resolve_memory(agent(memory), (), CONFIG)
    assert resolution.reason is MemoryReason.UNKNOWN_REDACTOR
    assert not resolution.ready and resolution.enabled  # wired, but every write would be refused
    assert "badge, employee-id" in resolution.message
    assert "proxy.redactPatterns" in resolution.message
    assert "email" not in resolution.message.split("names ", 1)[1].split(",", 1)[0]


def test_a_configured_custom_redactor_is_known() -> None:
    config = OperatorConfig(proxy_url="http://proxy:8000", redactors=("employee-id",))
    resolution = resolve_memory(agent(MemorySpec(redact=("email", "card", "phone", "employee-id"))), (), config)
    assert resolution.reason is MemoryReason.WIRED and resolution.ready


def test_per_user_without_a_capability_key_blocks() -> None:
    resolution = resolve_memory(agent(MemorySpec(per_user=True)), (), CONFIG)
    assert resolution.reason is MemoryReason.USER_CAPABILITY_KEY_MISSING
    assert not resolution.ready
    assert "proxy.capabilityKey.enabled" in resolution.message
    config = OperatorConfig(proxy_url="http://proxy:8000", user_capabilities=True)
    assert resolve_memory(agent(MemorySpec(per_user=True)), (), config).ready


def test_every_finding_is_reported_and_the_first_blocking_one_is_the_reason() -> None:
    memory = MemorySpec(scope=Scope.SHARED, redact=("nope",), backend_addr="v:6379")
    resolution = resolve_memory(agent(memory), (), CONFIG)
    assert resolution.reason is MemoryReason.UNKNOWN_REDACTOR
    assert {f.reason for f in resolution.findings} == {
        MemoryReason.NOT_A_REGISTRY_MEMBER,
        MemoryReason.UNKNOWN_REDACTOR,
        MemoryReason.BACKEND_ADDR_IGNORED,
    }
    for finding in resolution.findings:
        assert finding.message in resolution.message


def test_the_launcher_is_ready_only_when_its_agent_listens() -> None:
    """A readiness probe on the launcher's agent check: a cold pod gets no turn before its agent is up."""
    from sessionmem_core import api, env
    from sessionmem_operator.wiring import launcher_container

    spec = agent(MemorySpec())
    container = launcher_container(spec, resolve_memory(spec, (), CONFIG), CONFIG)
    probe = container["readinessProbe"]["httpGet"]
    assert probe == {"path": api.AGENT_READY_PATH, "port": env.DEFAULT_SERVE_PORT}
    # The launcher's answer waits for the agent: the probe must wait longer, or it fails all the same.
    assert container["readinessProbe"]["timeoutSeconds"] > api.AGENT_READY_WAIT_SECONDS
    assert container["readinessProbe"]["initialDelaySeconds"] >= 2
    assert container["ports"][0]["containerPort"] == env.DEFAULT_SERVE_PORT
