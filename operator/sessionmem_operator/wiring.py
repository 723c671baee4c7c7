"""Memory wiring: which scope is in effect, and the launcher sidecar that carries it into the pod.

Pure functions. Everything the launcher needs arrives as static env (Knative rejects ``valueFrom``), so the
wiring is entirely visible in the pod template and any change to it rolls a new revision.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sessionmem_core import env, kube
from sessionmem_core.keys import Scope, session_prefix, shared_prefix
from sessionmem_operator.config import OperatorConfig
from sessionmem_operator.spec import BUILTIN_REDACTORS, DEFAULT_TOKEN_COUNTER, AgentSpec

LAUNCHER_CONTAINER = "sessionmem-launcher"
LAUNCHER_COMMAND = ["python", "-m", "sessionmem_launcher"]
TOKEN_VOLUME = "sessionmem-token"
SERVE_PORT_NAME = "http1"  # Knative reads the port name to pick the protocol (http1 | h2c)


class MemoryReason(StrEnum):
    WIRED = "Wired"
    DISABLED = "Disabled"
    NOT_A_REGISTRY_MEMBER = "NotARegistryMember"
    AMBIGUOUS_REGISTRY = "AmbiguousRegistry"


@dataclass(frozen=True, slots=True)
class MemoryResolution:
    """The outcome of wiring an agent's memory: what is in effect and, when it differs from the request,
    why. ``scope``/``key_prefix`` are None only when memory is disabled."""

    reason: MemoryReason
    message: str
    scope: Scope | None = None
    registry: str | None = None
    key_prefix: str | None = None

    @property
    def enabled(self) -> bool:
        return self.scope is not None

    @property
    def ready(self) -> bool:
        return self.reason is MemoryReason.WIRED

    @property
    def warning(self) -> bool:
        """The request could not be honoured: worth a Warning Event, not just a condition."""
        return self.reason in (MemoryReason.NOT_A_REGISTRY_MEMBER, MemoryReason.AMBIGUOUS_REGISTRY)


def _backend_note(agent: AgentSpec, config: OperatorConfig) -> str:
    assert agent.memory is not None
    if config.proxy_url is not None:
        ignored = " (spec.sessionMemory.backend.addr is ignored: the proxy owns the backend)"
        return f"via the state-layer proxy {config.proxy_url}" + (ignored if agent.memory.backend_addr else "")
    unknown = [name for name in agent.memory.redact if name not in BUILTIN_REDACTORS]
    refused = (
        f" (redactors {', '.join(unknown)} are not built in and direct mode has no SESSIONMEM_REDACT_PATTERNS: "
        "writes will be refused)"
        if unknown
        else ""
    )
    return f"directly on {backend_addr(agent)}" + refused


def backend_addr(agent: AgentSpec) -> str:
    """Direct mode (no proxy configured): the agent's backend, else the chart's default Valkey."""
    assert agent.memory is not None
    return agent.memory.backend_addr or env.DEFAULT_BACKEND_ADDR


def resolve_memory(agent: AgentSpec, registries: Sequence[str], config: OperatorConfig) -> MemoryResolution:
    """Decide the scope in effect. Shared needs exactly one registry listing the agent; otherwise the
    private layout stays (never a rootless shared key) and the reason says why."""
    if agent.memory is None:
        return MemoryResolution(MemoryReason.DISABLED, "spec.sessionMemory is not set: the agent runs without memory")
    private = session_prefix(agent.owner)
    backend = _backend_note(agent, config)
    if agent.memory.scope is Scope.SESSION:
        return MemoryResolution(
            MemoryReason.WIRED, f"session scope, key prefix {private}, {backend}", Scope.SESSION, None, private
        )
    registry = kube.effective_registry(registries)
    if registry is not None:
        prefix = shared_prefix(registry)
        return MemoryResolution(
            MemoryReason.WIRED,
            f"shared scope of AgentRegistry {registry}, key prefix {prefix}, {backend}",
            Scope.SHARED,
            registry,
            prefix,
        )
    if not registries:
        return MemoryResolution(
            MemoryReason.NOT_A_REGISTRY_MEMBER,
            f"shared scope requested but no AgentRegistry lists {agent.namespace}/{agent.name}: "
            f"keeping the private layout {private}",
            Scope.SESSION,
            None,
            private,
        )
    return MemoryResolution(
        MemoryReason.AMBIGUOUS_REGISTRY,
        f"shared scope requested but {len(registries)} AgentRegistries list {agent.namespace}/{agent.name} "
        f"({', '.join(registries)}): keeping the private layout {private}",
        Scope.SESSION,
        None,
        private,
    )


def _env_var(name: str, value: str | int | bool) -> dict[str, str]:
    if isinstance(value, bool):
        value = "true" if value else "false"
    return {"name": name, "value": str(value)}


def launcher_env(agent: AgentSpec, resolution: MemoryResolution, config: OperatorConfig) -> list[dict[str, str]]:
    """The launcher's whole configuration (read by sessionmem_core.env.LauncherSettings)."""
    memory = agent.memory
    assert memory is not None and resolution.scope is not None
    variables = [
        _env_var(env.NAMESPACE, agent.namespace),
        _env_var(env.AGENT, agent.name),
        _env_var(env.SCOPE, resolution.scope.value),
    ]
    if resolution.registry is not None:
        variables.append(_env_var(env.REGISTRY, resolution.registry))
    variables += [
        _env_var(env.PER_USER, memory.per_user),
        _env_var(env.REPLAY_MESSAGES, memory.replay_messages),
    ]
    if memory.replay_tokens is not None:
        variables.append(_env_var(env.REPLAY_TOKENS, memory.replay_tokens))
    # The policies below are emitted only when set, so an object defaulted by a newer CRD keeps its template.
    if memory.token_counter != DEFAULT_TOKEN_COUNTER:
        variables.append(_env_var(env.TOKEN_COUNTER, memory.token_counter))
    if memory.redact:
        variables.append(_env_var(env.REDACT, ",".join(memory.redact)))
    if memory.summary is not None:
        if memory.summary.threshold is not None:
            variables.append(_env_var(env.SUMMARY_THRESHOLD, memory.summary.threshold))
        variables.append(_env_var(env.SUMMARIZER_URL, memory.summary.endpoint))
    variables += [
        _env_var(env.CAP, memory.max_entries),
        _env_var(env.TTL_SECONDS, memory.ttl_seconds),
        _env_var(env.LAUNCHER_PORT, env.DEFAULT_LAUNCHER_PORT),
        _env_var(env.SERVE_PORT, env.DEFAULT_SERVE_PORT),
        _env_var(env.AGENT_PORT, agent.agent_port),
    ]
    if config.proxy_url is not None:
        variables += [_env_var(env.PROXY_URL, config.proxy_url), _env_var(env.TOKEN_PATH, env.DEFAULT_TOKEN_PATH)]
    else:
        variables.append(_env_var(env.BACKEND_ADDR, backend_addr(agent)))
    return variables


def agent_memory_env(agent: AgentSpec) -> list[dict[str, str]]:
    """What the agent container is told when it sits behind the launcher: where to listen, and where its
    memory endpoint is (127.0.0.1 inside the pod)."""
    return [
        _env_var(env.AGENT_PORT, agent.agent_port),
        _env_var(env.LAUNCHER_PORT, env.DEFAULT_LAUNCHER_PORT),
    ]


def token_volume(config: OperatorConfig) -> dict[str, Any]:
    """A projected ServiceAccount token for the proxy's audience, rotated by the kubelet."""
    return {
        "name": TOKEN_VOLUME,
        # Default file mode: the launcher may run as any non-root user, and the token must stay readable to it.
        "projected": {
            "sources": [
                {
                    "serviceAccountToken": {
                        "audience": config.audience,
                        "expirationSeconds": config.token_expiration_seconds,
                        "path": posixpath.basename(env.DEFAULT_TOKEN_PATH),
                    }
                }
            ],
        },
    }


def uses_token(config: OperatorConfig) -> bool:
    """The token is the launcher's credential for the proxy; in direct mode there is no one to show it to."""
    return config.proxy_url is not None


def launcher_container(agent: AgentSpec, resolution: MemoryResolution, config: OperatorConfig) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": LAUNCHER_CONTAINER,
        "image": config.launcher_image,
        "command": list(LAUNCHER_COMMAND),
        "ports": [{"name": SERVE_PORT_NAME, "containerPort": env.DEFAULT_SERVE_PORT, "protocol": "TCP"}],
        "env": launcher_env(agent, resolution, config),
        "resources": {section: dict(values) for section, values in config.launcher_resources.items()},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if uses_token(config):
        # Only the launcher sees the token: the agent process cannot present it to the proxy itself.
        container["volumeMounts"] = [
            {"name": TOKEN_VOLUME, "mountPath": posixpath.dirname(env.DEFAULT_TOKEN_PATH), "readOnly": True}
        ]
    return container


def wiring_hash(launcher: dict[str, Any], volumes: Sequence[dict[str, Any]], service_account: str) -> str:
    """A short digest of everything memory-related in the pod template, exposed as an annotation so a
    wiring change is visible at a glance and always alters the template."""
    canonical = json.dumps(
        {"launcher": launcher, "volumes": list(volumes), "serviceAccount": service_account},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
