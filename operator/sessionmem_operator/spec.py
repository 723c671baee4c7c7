"""The AgentDeployment as typed values: parsed once from the API object, then passed to pure functions.

The API server has already validated and defaulted the object (crds.py); the defaults are applied again
here only so an object stored before a default existed still parses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sessionmem_core import env
from sessionmem_core.keys import Owner, Scope


class ExecutionModel(StrEnum):
    SERVING = "serving"
    DEPLOYMENT = "deployment"


class SpecError(ValueError):
    """The object does not parse: only possible when it bypassed the CRD schema (e.g. an old version)."""


# What the launcher does when the spec says nothing (sessionmem_core.env.LauncherSettings' defaults).
DEFAULT_TOKEN_COUNTER = "approx"
BUILTIN_SUMMARIZER = "builtin"

_DURATION = re.compile(r"^(?:(?P<h>[0-9]+)h)?(?:(?P<m>[0-9]+)m)?(?:(?P<s>[0-9]+)s)?$")


def parse_duration(text: str) -> int:
    """``24h``, ``90m``, ``1h30m``, ``45s`` -> seconds (the CRD's ttl format)."""
    match = _DURATION.match(text)
    if not text or match is None:
        raise SpecError(f"{text!r} is not a duration like 24h, 90m or 1h30m")
    hours, minutes, seconds = (int(match.group(unit) or 0) for unit in ("h", "m", "s"))
    return hours * 3600 + minutes * 60 + seconds


@dataclass(frozen=True, slots=True)
class SummarySpec:
    """Rolling summary: ``threshold`` None means off (the object alone does not switch it on)."""

    threshold: int | None = None
    endpoint: str = BUILTIN_SUMMARIZER

    @classmethod
    def from_spec(cls, raw: Mapping[str, Any]) -> SummarySpec:
        threshold = raw.get("threshold")
        return cls(
            threshold=int(threshold) if threshold is not None else None,
            endpoint=str(raw.get("endpoint") or BUILTIN_SUMMARIZER),
        )


@dataclass(frozen=True, slots=True)
class MemorySpec:
    scope: Scope = Scope.SESSION
    per_user: bool = False
    backend_addr: str | None = None
    replay_messages: int = env.DEFAULT_REPLAY_MESSAGES
    replay_tokens: int | None = None
    max_entries: int = env.DEFAULT_CAP
    ttl_seconds: int = env.DEFAULT_TTL_SECONDS
    redact: tuple[str, ...] = ()
    summary: SummarySpec | None = None
    token_counter: str = DEFAULT_TOKEN_COUNTER

    @classmethod
    def from_spec(cls, raw: Mapping[str, Any]) -> MemorySpec:
        backend = raw.get("backend") or {}
        ttl = raw.get("ttl")
        summary = raw.get("summary")
        try:
            return cls(
                scope=Scope(raw.get("scope") or Scope.SESSION.value),
                per_user=bool(raw.get("perUser", False)),
                backend_addr=backend.get("addr") or None,
                replay_messages=int(raw.get("replayMessages", env.DEFAULT_REPLAY_MESSAGES)),
                replay_tokens=int(raw["replayTokens"]) if raw.get("replayTokens") else None,
                max_entries=int(raw.get("maxEntries", env.DEFAULT_CAP)),
                ttl_seconds=parse_duration(str(ttl)) if ttl else env.DEFAULT_TTL_SECONDS,
                redact=tuple(str(name) for name in raw.get("redact") or ()),
                summary=SummarySpec.from_spec(summary) if summary is not None else None,
                token_counter=str(raw.get("tokenCounter") or DEFAULT_TOKEN_COUNTER),
            )
        except (TypeError, ValueError) as exc:
            raise SpecError(f"spec.sessionMemory: {exc}") from exc


@dataclass(frozen=True, slots=True)
class AgentSpec:
    namespace: str
    name: str
    uid: str
    generation: int
    image: str
    execution_model: ExecutionModel = ExecutionModel.SERVING
    port: int | None = None
    env: tuple[tuple[str, str], ...] = ()
    memory: MemorySpec | None = None
    # spec.securityContext: fields replacing the agent container's `restricted` defaults (security.py).
    security_context: Mapping[str, Any] = field(default_factory=dict)
    # Passed through as given (the CRD schema validated them): the agent container's resources and
    # envFrom, and the pod's imagePullSecrets, nodeSelector and tolerations.
    resources: Mapping[str, Any] = field(default_factory=dict)
    env_from: tuple[Mapping[str, Any], ...] = ()
    image_pull_secrets: tuple[Mapping[str, Any], ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()

    @property
    def owner(self) -> Owner:
        return Owner(namespace=self.namespace, agent=self.name)

    @property
    def agent_port(self) -> int:
        """Where the agent process listens: behind the launcher with memory, serving directly without."""
        if self.port is not None:
            return self.port
        return env.DEFAULT_AGENT_PORT if self.memory is not None else env.DEFAULT_SERVE_PORT

    @property
    def serving_port(self) -> int:
        """The pod's serving port (what the Service / Knative route sends traffic to)."""
        return env.DEFAULT_SERVE_PORT if self.memory is not None else self.agent_port


def parse_agent(body: Mapping[str, Any]) -> AgentSpec:
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    image = spec.get("image")
    if not image:
        raise SpecError("spec.image is required")
    try:
        model = ExecutionModel(spec.get("executionModel") or ExecutionModel.SERVING.value)
    except ValueError as exc:
        raise SpecError(f"spec.executionModel: {exc}") from exc
    raw_memory = spec.get("sessionMemory")
    return AgentSpec(
        namespace=str(meta["namespace"]),
        name=str(meta["name"]),
        uid=str(meta.get("uid", "")),
        generation=int(meta.get("generation") or 0),
        image=str(image),
        execution_model=model,
        port=int(spec["port"]) if spec.get("port") is not None else None,
        env=tuple((str(item["name"]), str(item.get("value", ""))) for item in spec.get("env") or ()),
        # `sessionMemory: {}` is "on with every default": only an absent (or null) field switches it off.
        memory=MemorySpec.from_spec(raw_memory) if raw_memory is not None else None,
        security_context=dict(spec.get("securityContext") or {}),
        resources=dict(spec.get("resources") or {}),
        env_from=tuple(dict(item) for item in spec.get("envFrom") or ()),
        image_pull_secrets=tuple(dict(item) for item in spec.get("imagePullSecrets") or ()),
        node_selector={str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
        tolerations=tuple(dict(item) for item in spec.get("tolerations") or ()),
    )
