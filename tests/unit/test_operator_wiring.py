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
    via_proxy = resolve_memory(agent(MemorySpec(backend_addr="v:6379")), (), CONFIG)
    assert "proxy http://proxy:8000" in via_proxy.message and "ignored" in via_proxy.message
    direct = resolve_memory(agent(MemorySpec(backend_addr="v:6379")), (), OperatorConfig())
    assert "directly on v:6379" in direct.message


def test_direct_mode_message_warns_about_redactors_it_cannot_apply() -> None:
    memory = MemorySpec(redact=("email", "employee-id"))
    direct = resolve_memory(agent(memory), (), OperatorConfig())
    assert "employee-id are not built in" in direct.message and "refused" in direct.message
    assert direct.ready  # still wired: the operator cannot fix it, the message says what will happen
    builtin_only = resolve_memory(agent(MemorySpec(redact=("email", "card"))), (), OperatorConfig())
    assert "refused" not in builtin_only.message
    # Behind a proxy the names may come from its SESSIONMEM_REDACT_PATTERNS: nothing to say.
    assert "refused" not in resolve_memory(agent(memory), (), CONFIG).message
