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

from sessionmem_core import api, env, kube
from sessionmem_core.api import BUILTIN_REDACTORS
from sessionmem_core.keys import Scope, session_prefix, shared_prefix
from sessionmem_operator.config import OperatorConfig
from sessionmem_operator.security import launcher_security_context
from sessionmem_operator.spec import DEFAULT_TOKEN_COUNTER, AgentSpec

LAUNCHER_CONTAINER = "sessionmem-launcher"
LAUNCHER_COMMAND = ["python", "-m", "sessionmem_launcher"]
TOKEN_VOLUME = "sessionmem-token"
SERVE_PORT_NAME = "http1"  # Knative reads the port name to pick the protocol (http1 | h2c)
# The launcher listens about half a second after its start on an idle machine, over a second on a busy
# node (seen: both probes at 1 s refused); a probe before that is refused, a Warning Event. No cost: the
# probe at 0 s used to fail, so readiness came at the 2 s period anyway, and Knative's activator probes
# the pod itself for a cold turn.
READY_INITIAL_DELAY_SECONDS = 2


class MemoryReason(StrEnum):
    WIRED = "Wired"
    DISABLED = "Disabled"
    NOT_A_REGISTRY_MEMBER = "NotARegistryMember"
    AMBIGUOUS_REGISTRY = "AmbiguousRegistry"
    NO_PROXY_CONFIGURED = "NoProxyConfigured"
    UNKNOWN_REDACTOR = "UnknownRedactor"
    USER_CAPABILITY_KEY_MISSING = "UserCapabilityKeyMissing"
    BACKEND_ADDR_IGNORED = "BackendAddrIgnored"
    KNATIVE_SERVING_NOT_INSTALLED = "KnativeServingNotInstalled"
    NAME_CONFLICT = "NameConflict"
    # Health, after the wiring (status.memory_condition): the backend or the agent's own pods are down.
    MEMORY_BACKEND_UNAVAILABLE = "MemoryBackendUnavailable"
    PROXY_UNREACHABLE = "ProxyUnreachable"
    AGENT_NOT_RUNNING = "AgentNotRunning"


# Chart values that fix each finding, named in its message so the reader knows what to change.
PROXY_URL_VALUE = "operator.proxyUrl"
REDACT_PATTERNS_VALUE = "proxy.redactPatterns"
CAPABILITY_KEY_VALUE = "proxy.capabilityKey.enabled"


@dataclass(frozen=True, slots=True)
class Finding:
    """Something about an agent's memory request that the operator cannot honour as asked. A blocking
    finding means memory calls will fail: MemoryReady goes False. Every finding is a Warning Event."""

    reason: MemoryReason
    message: str
    blocking: bool


@dataclass(frozen=True, slots=True)
class MemoryResolution:
    """The outcome of wiring an agent's memory: what is in effect and, when it differs from the request,
    why. ``scope``/``key_prefix`` are None when no launcher is injected (memory off, or no proxy to reach).
    ``ready`` is True only when a memory call from the agent can succeed."""

    reason: MemoryReason
    message: str
    scope: Scope | None = None
    registry: str | None = None
    key_prefix: str | None = None
    ready: bool = False
    findings: tuple[Finding, ...] = ()

    @property
    def enabled(self) -> bool:
        return self.scope is not None

    @property
    def warning(self) -> bool:
        """The request could not be honoured as asked: worth a Warning Event, not just a condition."""
        return bool(self.findings)


def memory_findings(agent: AgentSpec, config: OperatorConfig) -> list[Finding]:
    """What will not work as the agent asks, given how the proxy is configured; blocking ones first."""
    memory = agent.memory
    assert memory is not None
    findings: list[Finding] = []
    unknown = sorted(set(memory.redact) - config.known_redactors)
    if unknown:
        custom = ", ".join(config.redactors) or "none"
        findings.append(
            Finding(
                MemoryReason.UNKNOWN_REDACTOR,
                f"spec.sessionMemory.redact names {', '.join(unknown)}, which the proxy does not know (built in: "
                f"{', '.join(BUILTIN_REDACTORS)}; configured: {custom}): every write would be refused. Define "
                f"them in the chart value {REDACT_PATTERNS_VALUE} (name -> regex) or remove them from the list",
                blocking=True,
            )
        )
    if memory.per_user and not config.user_capabilities:
        findings.append(
            Finding(
                MemoryReason.USER_CAPABILITY_KEY_MISSING,
                "spec.sessionMemory.perUser is true but the proxy has no key to verify users' run capabilities: "
                f"every call would be refused (401). Set the chart value {CAPABILITY_KEY_VALUE}=true (and give "
                "the service that signs capabilities the same key), or drop perUser",
                blocking=True,
            )
        )
    if memory.backend_addr:
        findings.append(
            Finding(
                MemoryReason.BACKEND_ADDR_IGNORED,
                f"spec.sessionMemory.backend.addr ({memory.backend_addr}) is ignored: the launcher always goes "
                "through the state-layer proxy, which owns the backend (the chart's valkey or externalValkey); "
                "remove the field",
                blocking=False,
            )
        )
    return findings


def _scope_resolution(agent: AgentSpec, registries: Sequence[str]) -> MemoryResolution:
    """The scope in effect. Shared needs exactly one registry listing the agent; otherwise the private
    layout stays (never a rootless shared key) and the reason says why."""
    assert agent.memory is not None
    private = session_prefix(agent.owner)
    if agent.memory.scope is Scope.SESSION:
        return MemoryResolution(
            MemoryReason.WIRED, f"session scope, key prefix {private}", Scope.SESSION, None, private, ready=True
        )
    registry = kube.effective_registry(registries)
    if registry is not None:
        prefix = shared_prefix(registry)
        return MemoryResolution(
            MemoryReason.WIRED,
            f"shared scope of AgentRegistry {registry}, key prefix {prefix}",
            Scope.SHARED,
            registry,
            prefix,
            ready=True,
        )
    if not registries:
        message = (
            f"shared scope requested but no AgentRegistry lists {agent.namespace}/{agent.name}: "
            f"keeping the private layout {private}"
        )
        reason = MemoryReason.NOT_A_REGISTRY_MEMBER
    else:
        message = (
            f"shared scope requested but {len(registries)} AgentRegistries list {agent.namespace}/{agent.name} "
            f"({', '.join(registries)}): keeping the private layout {private}"
        )
        reason = MemoryReason.AMBIGUOUS_REGISTRY
    return MemoryResolution(reason, message, Scope.SESSION, None, private, findings=(Finding(reason, message, False),))


def resolve_memory(agent: AgentSpec, registries: Sequence[str], config: OperatorConfig) -> MemoryResolution:
    """Decide what is in effect and whether a memory call from the agent can succeed.

    The condition's reason is the first blocking finding, else the scope's own shortfall, else the first
    finding that only warns (e.g. BackendAddrIgnored, with MemoryReady still True), else Wired."""
    if agent.memory is None:
        return MemoryResolution(MemoryReason.DISABLED, "spec.sessionMemory is not set: the agent runs without memory")
    if config.proxy_url is None:
        message = (
            "no state-layer proxy URL is configured, and the launcher reaches memory only through the proxy: "
            f'the agent runs without memory. Set the chart value {PROXY_URL_VALUE} to "" (this release\'s '
            "proxy, the default) or to the proxy's URL"
        )
        reason = MemoryReason.NO_PROXY_CONFIGURED
        return MemoryResolution(reason, message, findings=(Finding(reason, message, True),))
    scoped = _scope_resolution(agent, registries)
    findings = memory_findings(agent, config)
    blocking = [finding for finding in findings if finding.blocking]
    if blocking:
        reason = blocking[0].reason
    elif not scoped.ready:
        reason = scoped.reason
    elif findings:
        reason = findings[0].reason
    else:
        reason = MemoryReason.WIRED
    message = "; ".join(
        [f"{scoped.message}, via the state-layer proxy {config.proxy_url}"] + [f.message for f in findings]
    )
    return MemoryResolution(
        reason,
        message,
        scoped.scope,
        scoped.registry,
        scoped.key_prefix,
        ready=scoped.ready and not blocking,
        findings=(*scoped.findings, *findings),
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
    # Only ever through the proxy: the launcher has no direct mode (resolve_memory injects no launcher
    # without a proxy URL).
    assert config.proxy_url is not None
    variables += [_env_var(env.PROXY_URL, config.proxy_url), _env_var(env.TOKEN_PATH, env.DEFAULT_TOKEN_PATH)]
    # Only when configured, so pods keep their template (no new revision) under the launcher's defaults.
    variables += [_env_var(name, value) for name, value in config.launcher_limits]
    if config.launcher_otlp_endpoint is not None:
        variables.append(_env_var(env.OTEL_EXPORTER_OTLP_ENDPOINT, config.launcher_otlp_endpoint))
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


def launcher_container(agent: AgentSpec, resolution: MemoryResolution, config: OperatorConfig) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": LAUNCHER_CONTAINER,
        "image": config.launcher_image,
        "command": list(LAUNCHER_COMMAND),
        "ports": [{"name": SERVE_PORT_NAME, "containerPort": env.DEFAULT_SERVE_PORT, "protocol": "TCP"}],
        "env": launcher_env(agent, resolution, config),
        # Ready once the agent behind the launcher listens: a new or cold pod takes no turn before that. The
        # answer waits for the agent (api.AGENT_READY_WAIT_SECONDS), so the probe succeeds as it comes up
        # instead of failing (a Warning Event each) until the next period; the first probe comes once the
        # launcher listens.
        "readinessProbe": {
            "httpGet": {"path": api.AGENT_READY_PATH, "port": env.DEFAULT_SERVE_PORT},
            "initialDelaySeconds": READY_INITIAL_DELAY_SECONDS,
            "timeoutSeconds": int(api.AGENT_READY_WAIT_SECONDS) + 1,
            "periodSeconds": 2,
            "failureThreshold": 1,
        },
        "resources": {section: dict(values) for section, values in config.launcher_resources.items()},
        "securityContext": launcher_security_context(),
    }
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
