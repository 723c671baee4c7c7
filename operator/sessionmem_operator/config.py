"""Operator settings: an optional YAML file (``SESSIONMEM_OPERATOR_CONFIG_FILE``) overridden by the
``SESSIONMEM_OPERATOR_*`` variables the chart sets. Read once at start-up; a bad value stops the operator
before it touches the cluster.

YAML keys (all optional)::

    proxyUrl: http://sessionmem-proxy.sessionmem.svc:8000   # unset: no memory (MemoryReady False says so)
    launcherImage: ghcr.io/ctxmesh/sessionmem:0.1.0
    audience: sessionmem-proxy
    tokenExpirationSeconds: 600
    namespaces: [team-a, team-b]        # unset or empty: the whole cluster
    livenessEndpoint: http://0.0.0.0:8080/healthz
    logFormat: json                      # json | plain
    launcherResources: {requests: {cpu: 25m, memory: 64Mi}, limits: {memory: 256Mi}}
    redactors: [employee-id]             # the proxy's custom redactors (its SESSIONMEM_REDACT_PATTERNS names)
    userCapabilities: false              # the proxy verifies users' run capabilities (perUser works)
    resyncSeconds: 60                    # every AgentDeployment is re-applied this often (drift repair)
    memoryHealthSeconds: 10              # the proxy's /readyz is probed this often (MemoryReady); 0: never
    launcherLimits: {maxHeaderBytes: 8192, idleTimeoutSeconds: 15}   # unset keys: the launcher's defaults
    launcherOtlpEndpoint: http://collector.observability.svc:4318     # unset: the launchers export no spans
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import yaml

from sessionmem_core import env
from sessionmem_core.api import BUILTIN_REDACTORS
from sessionmem_core.env import ConfigError

DEFAULT_LAUNCHER_IMAGE = "ghcr.io/ctxmesh/sessionmem:0.1.0"
# The API server refuses projected tokens valid for less than 10 minutes; a day is plenty for "short-lived".
MIN_TOKEN_EXPIRATION_SECONDS = 600
MAX_TOKEN_EXPIRATION_SECONDS = 24 * 3600
DEFAULT_TOKEN_EXPIRATION_SECONDS = MIN_TOKEN_EXPIRATION_SECONDS
DEFAULT_LAUNCHER_RESOURCES: Mapping[str, Mapping[str, str]] = {
    "requests": {"cpu": "25m", "memory": "64Mi"},
    "limits": {"memory": "256Mi"},
}
LOG_FORMATS = ("json", "plain")
# Often enough that drift (a deleted ServiceAccount, a hand-edited child) does not outlive a coffee break,
# rarely enough that a thousand agents cost a few applies a second.
DEFAULT_RESYNC_SECONDS = 60.0
MIN_RESYNC_SECONDS = 1.0
# How soon MemoryReady follows the memory backend going down or up (the proxy's /readyz, one GET per
# operator per interval, whatever the number of agents).
DEFAULT_MEMORY_HEALTH_SECONDS = 10.0
MIN_MEMORY_HEALTH_SECONDS = 1.0
# The CRD's rule for a redactor name (crds.REDACTOR_PATTERN), checked here so a typo fails at start-up.
_REDACTOR_NAME = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
# The launcher's serving limits an operator may set for every agent pod: config key -> the env name the
# launcher reads (the same names the chart's proxy.limits use for the proxy).
LAUNCHER_LIMITS: Mapping[str, str] = {
    "maxHeaderBytes": env.MAX_HEADER_BYTES,
    "maxHeaderCount": env.MAX_HEADER_COUNT,
    "maxUrlBytes": env.MAX_URL_BYTES,
    "maxBodyBytes": env.MAX_REQUEST_BODY_BYTES,
    "headerTimeoutSeconds": env.HEADER_TIMEOUT_SECONDS,
    "bodyTimeoutSeconds": env.BODY_TIMEOUT_SECONDS,
    "idleTimeoutSeconds": env.IDLE_TIMEOUT_SECONDS,
    "maxConnections": env.MAX_CONNECTIONS,
}

_FILE_KEYS = {
    "proxyUrl",
    "launcherImage",
    "audience",
    "tokenExpirationSeconds",
    "namespaces",
    "livenessEndpoint",
    "logFormat",
    "launcherResources",
    "redactors",
    "userCapabilities",
    "resyncSeconds",
    "memoryHealthSeconds",
    "launcherLimits",
    "launcherOtlpEndpoint",
}


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    launcher_image: str = DEFAULT_LAUNCHER_IMAGE
    proxy_url: str | None = None
    audience: str = env.DEFAULT_AUDIENCE
    token_expiration_seconds: int = DEFAULT_TOKEN_EXPIRATION_SECONDS
    namespaces: tuple[str, ...] = ()
    liveness_endpoint: str | None = None
    log_format: str = "json"
    launcher_resources: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: DEFAULT_LAUNCHER_RESOURCES)
    # Redactor names the proxy defines besides the built-in ones (the keys of its SESSIONMEM_REDACT_PATTERNS).
    redactors: tuple[str, ...] = ()
    # Whether the proxy verifies users' run capabilities: without it every perUser call is refused.
    user_capabilities: bool = False
    resync_seconds: float = DEFAULT_RESYNC_SECONDS
    # 0: the proxy's health is not probed (e.g. no network path from the operator to a proxy elsewhere),
    # and MemoryReady then says only whether the agent is wired.
    memory_health_seconds: float = DEFAULT_MEMORY_HEALTH_SECONDS
    # (env name, value) pairs added to every launcher's env; empty: the launcher's own defaults.
    launcher_limits: tuple[tuple[str, str], ...] = ()
    # Where every launcher exports its memory.* spans (OTLP/HTTP); None: they export none.
    launcher_otlp_endpoint: str | None = None

    def __post_init__(self) -> None:
        if not self.launcher_image or any(c.isspace() for c in self.launcher_image):
            raise ConfigError(f"launcher image {self.launcher_image!r} is not an image reference")
        if self.proxy_url is not None:
            parts = urlsplit(self.proxy_url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ConfigError(f"proxy URL {self.proxy_url!r} must be an http(s) URL with a host")
        if self.launcher_otlp_endpoint is not None:
            parts = urlsplit(self.launcher_otlp_endpoint)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ConfigError(
                    f"launcher OTLP endpoint {self.launcher_otlp_endpoint!r} must be an http(s) URL with a host"
                )
        if not self.audience:
            raise ConfigError("the token audience must not be empty")
        if not MIN_TOKEN_EXPIRATION_SECONDS <= self.token_expiration_seconds <= MAX_TOKEN_EXPIRATION_SECONDS:
            raise ConfigError(
                f"token expiration {self.token_expiration_seconds}s is outside "
                f"[{MIN_TOKEN_EXPIRATION_SECONDS}, {MAX_TOKEN_EXPIRATION_SECONDS}]"
            )
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"log format {self.log_format!r} must be one of {', '.join(LOG_FORMATS)}")
        for name in self.redactors:
            if not _REDACTOR_NAME.match(name):
                raise ConfigError(f"redactor name {name!r} must match {_REDACTOR_NAME.pattern}")
            if name in BUILTIN_REDACTORS:
                raise ConfigError(f"redactor {name!r} is built into the proxy: it cannot be redefined")
        if not self.resync_seconds >= MIN_RESYNC_SECONDS:
            raise ConfigError(f"resyncSeconds={self.resync_seconds} must be at least {MIN_RESYNC_SECONDS}")
        if self.memory_health_seconds != 0 and not self.memory_health_seconds >= MIN_MEMORY_HEALTH_SECONDS:
            raise ConfigError(
                f"memoryHealthSeconds={self.memory_health_seconds} must be 0 (off) or at least "
                f"{MIN_MEMORY_HEALTH_SECONDS}"
            )

    @property
    def known_redactors(self) -> frozenset[str]:
        """Every redactor name the proxy accepts."""
        return frozenset(BUILTIN_REDACTORS) | frozenset(self.redactors)

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None) -> OperatorConfig:
        environ = os.environ if environ is None else environ
        values = _read_file(environ.get(env.OPERATOR_CONFIG_FILE) or None)
        overrides = {
            "proxyUrl": environ.get(env.OPERATOR_PROXY_URL),
            "launcherImage": environ.get(env.OPERATOR_LAUNCHER_IMAGE),
            "audience": environ.get(env.OPERATOR_AUDIENCE),
            "tokenExpirationSeconds": environ.get(env.OPERATOR_TOKEN_EXPIRATION_SECONDS),
        }
        # An empty variable means "not set", so a chart can template it unconditionally.
        values.update({key: value for key, value in overrides.items() if value})
        return cls.from_mapping(values)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> OperatorConfig:
        unknown = set(values) - _FILE_KEYS
        if unknown:
            raise ConfigError(f"unknown operator setting(s): {', '.join(sorted(unknown))}")
        kwargs: dict[str, Any] = {}
        if values.get("proxyUrl"):
            kwargs["proxy_url"] = str(values["proxyUrl"]).rstrip("/")
        if values.get("launcherImage"):
            kwargs["launcher_image"] = str(values["launcherImage"])
        if values.get("audience"):
            kwargs["audience"] = str(values["audience"])
        if values.get("tokenExpirationSeconds") not in (None, ""):
            kwargs["token_expiration_seconds"] = _as_int("tokenExpirationSeconds", values["tokenExpirationSeconds"])
        if values.get("namespaces"):
            kwargs["namespaces"] = _as_names(values["namespaces"], "namespaces")
        if values.get("livenessEndpoint"):
            kwargs["liveness_endpoint"] = str(values["livenessEndpoint"])
        if values.get("logFormat"):
            kwargs["log_format"] = str(values["logFormat"])
        if values.get("launcherResources") is not None:
            kwargs["launcher_resources"] = _as_resources(values["launcherResources"])
        if values.get("redactors"):
            kwargs["redactors"] = _as_names(values["redactors"], "redactors")
        if values.get("userCapabilities") is not None:
            kwargs["user_capabilities"] = _as_bool("userCapabilities", values["userCapabilities"])
        if values.get("resyncSeconds") not in (None, ""):
            kwargs["resync_seconds"] = _as_float("resyncSeconds", values["resyncSeconds"])
        if values.get("memoryHealthSeconds") not in (None, ""):
            kwargs["memory_health_seconds"] = _as_float("memoryHealthSeconds", values["memoryHealthSeconds"])
        if values.get("launcherLimits"):
            kwargs["launcher_limits"] = _as_limits(values["launcherLimits"])
        if values.get("launcherOtlpEndpoint"):
            kwargs["launcher_otlp_endpoint"] = str(values["launcherOtlpEndpoint"])
        return cls(**kwargs)


def _read_file(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the operator config file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"the operator config file {path} is not valid YAML: {exc}") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"the operator config file {path} must hold a mapping")
    return dict(loaded)


_N = TypeVar("_N", int, float)


def _as_number(name: str, raw: object, parse: Callable[[str], _N], what: str) -> _N:
    # YAML's true/false would otherwise read as 1/0.
    if isinstance(raw, bool):
        raise ConfigError(f"{name}={raw!r} is not {what}")
    try:
        return parse(str(raw))
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is not {what}") from exc


def _as_int(name: str, raw: object) -> int:
    return _as_number(name, raw, int, "an integer")


def _as_float(name: str, raw: object) -> float:
    return _as_number(name, raw, float, "a number")


def _as_bool(name: str, raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean")


def _as_names(raw: object, name: str) -> tuple[str, ...]:
    if isinstance(raw, str):
        items = [part.strip() for part in raw.split(",")]
    elif isinstance(raw, list):
        items = [str(part).strip() for part in raw]
    else:
        raise ConfigError(f"{name}={raw!r} must be a list of names")
    return tuple(item for item in items if item)


def _as_limits(raw: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, dict) or not set(raw) <= set(LAUNCHER_LIMITS):
        raise ConfigError(f"launcherLimits must be a mapping with keys among {', '.join(LAUNCHER_LIMITS)}")
    limits = []
    for key, value in sorted(raw.items()):
        number = _as_float(f"launcherLimits.{key}", value)
        if not number > 0:
            raise ConfigError(f"launcherLimits.{key}={value!r} must be positive")
        if not key.endswith("Seconds") and not number.is_integer():
            raise ConfigError(f"launcherLimits.{key}={value!r} must be a whole number")
        # Counts and sizes stay integers; timeouts may be fractional.
        text = str(number) if key.endswith("Seconds") else str(int(number))
        limits.append((LAUNCHER_LIMITS[key], text))
    return tuple(limits)


def _as_resources(raw: object) -> Mapping[str, Mapping[str, str]]:
    if not isinstance(raw, dict) or not set(raw) <= {"requests", "limits"}:
        raise ConfigError("launcherResources must be a mapping with 'requests' and/or 'limits'")
    result: dict[str, dict[str, str]] = {}
    for section, quantities in raw.items():
        if not isinstance(quantities, dict):
            raise ConfigError(f"launcherResources.{section} must map resource names to quantities")
        result[str(section)] = {str(name): str(quantity) for name, quantity in quantities.items()}
    return result
