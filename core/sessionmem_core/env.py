"""Every environment variable name and default of sessionmem, in one place.

The operator writes these into the pod template (as static values: Knative rejects ``valueFrom``), the
chart writes the proxy's and operator's, and the launcher and proxy read them through here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

# --- defaults (DESIGN.md section 3) ---
DEFAULT_REPLAY_MESSAGES = 40
DEFAULT_CAP = 500
DEFAULT_TTL_SECONDS = 24 * 3600
DEFAULT_LAUNCHER_PORT = 2998
DEFAULT_SERVE_PORT = 8080
DEFAULT_AGENT_PORT = 8081
DEFAULT_TOKEN_PATH = "/var/run/secrets/sessionmem/token"
DEFAULT_AUDIENCE = "sessionmem-proxy"

# --- bounds the proxy enforces whatever a client asks for ---
MAX_READ_LIMIT = 500
MAX_CAP = 10_000
MAX_TTL_SECONDS = 30 * 24 * 3600
MAX_BODY_BYTES = 1024 * 1024
MAX_ENTRIES_PER_APPEND = 64
MAX_CONTENT_CHARS = 256 * 1024
# One entry's item as stored (JSON): past it, a typed 413. Its content is bounded by MAX_CONTENT_CHARS.
MAX_ITEM_BYTES = 512 * 1024

# --- pod (launcher) side, written by the operator ---
PROXY_URL = "SESSIONMEM_PROXY_URL"
# Never rendered (there is no direct mode: the launcher always talks to a proxy, and ignores it); named
# here so that tests can check it stays absent from every workload.
BACKEND_ADDR = "SESSIONMEM_BACKEND_ADDR"
TOKEN_PATH = "SESSIONMEM_TOKEN_PATH"
NAMESPACE = "SESSIONMEM_NAMESPACE"
AGENT = "SESSIONMEM_AGENT"
SCOPE = "SESSIONMEM_SCOPE"
REGISTRY = "SESSIONMEM_REGISTRY"
PER_USER = "SESSIONMEM_PER_USER"
REPLAY_MESSAGES = "SESSIONMEM_REPLAY_MESSAGES"
REPLAY_TOKENS = "SESSIONMEM_REPLAY_TOKENS"
CAP = "SESSIONMEM_CAP"
TTL_SECONDS = "SESSIONMEM_TTL_SECONDS"
LAUNCHER_PORT = "SESSIONMEM_LAUNCHER_PORT"
SERVE_PORT = "SESSIONMEM_SERVE_PORT"
AGENT_PORT = "SESSIONMEM_AGENT_PORT"
# Comma-separated redactors applied by the proxy before anything is stored (email, phone, card, or a
# name the proxy's SESSIONMEM_REDACT_PATTERNS defines).
REDACT = "SESSIONMEM_REDACT"
# Rolling summary: when a conversation holds more than this many entries, the launcher folds the older
# ones into one summary entry in the background (0: off). The summariser is an HTTP endpoint on the agent
# side, or "builtin".
SUMMARY_THRESHOLD = "SESSIONMEM_SUMMARY_THRESHOLD"
SUMMARIZER_URL = "SESSIONMEM_SUMMARIZER_URL"
# How replayed turns are counted against SESSIONMEM_REPLAY_TOKENS: "approx" or "module:function".
TOKEN_COUNTER = "SESSIONMEM_TOKEN_COUNTER"
PROXY_TIMEOUT_SECONDS = "SESSIONMEM_PROXY_TIMEOUT_SECONDS"
# Opening a connection to the proxy, bounded on its own: a proxy whose pod is gone (its Service IP drops
# the packets) would otherwise hold a turn for the kernel's SYN retries, minutes, before failing open.
# The default outlasts one lost SYN (retransmitted after 1 s).
PROXY_CONNECT_TIMEOUT_SECONDS = "SESSIONMEM_PROXY_CONNECT_TIMEOUT_SECONDS"
DEFAULT_PROXY_CONNECT_TIMEOUT_SECONDS = 1.5
AGENT_TIMEOUT_SECONDS = "SESSIONMEM_AGENT_TIMEOUT_SECONDS"

# --- proxy side, written by the chart ---
VALKEY_URL = "SESSIONMEM_VALKEY_URL"
AUTH_MODE = "SESSIONMEM_AUTH_MODE"  # "tokenreview" (default) | "dev" (explicit, never set by the chart)
AUDIENCE = "SESSIONMEM_AUDIENCE"
PROXY_HOST = "SESSIONMEM_PROXY_HOST"
PROXY_PORT = "SESSIONMEM_PROXY_PORT"
VALKEY_TIMEOUT_SECONDS = "SESSIONMEM_VALKEY_TIMEOUT_SECONDS"
# The shared key that verifies users' run capabilities (mounted from a Secret); unset: perUser is refused.
CAPABILITY_KEY_FILE = "SESSIONMEM_CAPABILITY_KEY_FILE"
# Signing keys rotate; buckets must not: a separate key derives them (unset: the single signing key does).
CAPABILITY_BUCKET_KEY_FILE = "SESSIONMEM_CAPABILITY_BUCKET_KEY_FILE"
# Longest lifetime (exp - iat) of a user capability the proxy accepts, whatever the minting side chose.
CAPABILITY_MAX_LIFETIME_SECONDS = "SESSIONMEM_CAPABILITY_MAX_LIFETIME_SECONDS"
DEFAULT_CAPABILITY_MAX_LIFETIME_SECONDS = 15 * 60
# Out-of-cluster API server access for TokenReview (tests, local runs); in a pod the in-cluster config is used.
KUBE_API_SERVER = "SESSIONMEM_KUBE_API_SERVER"
KUBE_CA_FILE = "SESSIONMEM_KUBE_CA_FILE"
KUBE_TOKEN_FILE = "SESSIONMEM_KUBE_TOKEN_FILE"
MEMBERSHIP_CACHE_SECONDS = "SESSIONMEM_MEMBERSHIP_CACHE_SECONDS"
# Extra named redactors, a JSON object of name -> regex, that agents may opt into besides the built-in ones.
REDACT_PATTERNS = "SESSIONMEM_REDACT_PATTERNS"
# Encryption at rest (off until a keyring is mounted): the key-encryption keys (a folder, one file per key
# id), where the wrapped data keys live ("secret": Secrets in SESSIONMEM_SEALING_NAMESPACE, the proxy's
# own; "directory": files in SESSIONMEM_SEALING_KEY_DIR), how long a replica caches an unwrapped one, and
# how many bytes of opened (decrypted) entries it keeps for rereads of the same window (0: none).
SEALING_KEYRING = "SESSIONMEM_SEALING_KEYRING"
SEALING_KEY_STORE = "SESSIONMEM_SEALING_KEY_STORE"
SEALING_NAMESPACE = "SESSIONMEM_SEALING_NAMESPACE"
SEALING_KEY_DIR = "SESSIONMEM_SEALING_KEY_DIR"
SEALING_CACHE_SECONDS = "SESSIONMEM_SEALING_CACHE_SECONDS"
SEALING_OPENED_BYTES = "SESSIONMEM_SEALING_OPENED_BYTES"
DEFAULT_SEALING_OPENED_BYTES = 16 * 1024 * 1024

# --- operator side, written by the chart ---
OPERATOR_PROXY_URL = "SESSIONMEM_OPERATOR_PROXY_URL"
OPERATOR_LAUNCHER_IMAGE = "SESSIONMEM_OPERATOR_LAUNCHER_IMAGE"
OPERATOR_AUDIENCE = "SESSIONMEM_OPERATOR_AUDIENCE"
OPERATOR_TOKEN_EXPIRATION_SECONDS = "SESSIONMEM_OPERATOR_TOKEN_EXPIRATION_SECONDS"
# The operator's own namespace (the chart sets it from the pod): where Events about cluster-scoped objects go.
OPERATOR_NAMESPACE = "SESSIONMEM_OPERATOR_NAMESPACE"
OPERATOR_CONFIG_FILE = "SESSIONMEM_OPERATOR_CONFIG_FILE"  # optional YAML file; the variables above override it

# --- kubectl sessionmem (a person's workstation, or a pod running it) ---
# The proxy's URL, when it is reachable directly (in-cluster, tests); unset: a port-forward to its Service.
KUBECTL_PROXY_URL = "SESSIONMEM_KUBECTL_PROXY_URL"
# Where the chart puts the proxy's Service: its release namespace, named <release>-sessionmem-proxy, or
# <release>-proxy when the release name contains sessionmem. The defaults fit a release named sessionmem.
DEFAULT_KUBECTL_PROXY_NAMESPACE = "sessionmem"
DEFAULT_KUBECTL_PROXY_SERVICE = "sessionmem-proxy"

# --- serving limits, the proxy's and the launcher's (docs/limits.md); the chart writes the proxy's ---
MAX_HEADER_BYTES = "SESSIONMEM_MAX_HEADER_BYTES"  # whole request head (request line + headers): 431
MAX_HEADER_COUNT = "SESSIONMEM_MAX_HEADER_COUNT"  # 431
MAX_URL_BYTES = "SESSIONMEM_MAX_URL_BYTES"  # 414
MAX_REQUEST_BODY_BYTES = "SESSIONMEM_MAX_BODY_BYTES"  # 413
HEADER_TIMEOUT_SECONDS = "SESSIONMEM_HEADER_TIMEOUT_SECONDS"  # request head must arrive within this
BODY_TIMEOUT_SECONDS = "SESSIONMEM_BODY_TIMEOUT_SECONDS"  # request body must arrive within this: 408
IDLE_TIMEOUT_SECONDS = "SESSIONMEM_IDLE_TIMEOUT_SECONDS"  # an idle keep-alive connection is closed
MAX_CONNECTIONS = "SESSIONMEM_MAX_CONNECTIONS"  # concurrent requests per worker; over it: 503

DEFAULT_MAX_HEADER_BYTES = 16 * 1024
DEFAULT_MAX_HEADER_COUNT = 64
DEFAULT_MAX_URL_BYTES = 4096
DEFAULT_HEADER_TIMEOUT_SECONDS = 10.0
DEFAULT_BODY_TIMEOUT_SECONDS = 10.0
DEFAULT_IDLE_TIMEOUT_SECONDS = 30.0
DEFAULT_MAX_CONNECTIONS = 1024

# --- per-agent quotas the proxy enforces (chart defaults; an AgentDeployment's
# spec.sessionMemory.quota overrides them for that agent); over quota: 429 (rate) or 507 (storage) ---
QUOTA_CONVERSATIONS = "SESSIONMEM_QUOTA_CONVERSATIONS"
QUOTA_BYTES = "SESSIONMEM_QUOTA_BYTES"
QUOTA_REQUESTS_PER_SECOND = "SESSIONMEM_QUOTA_REQUESTS_PER_SECOND"
QUOTA_BURST = "SESSIONMEM_QUOTA_BURST"
# Bytes an agent moves through the proxy per second (bodies it sends, answers it reads; exports are paced
# to it). The burst is twice the rate, and never less than two maximal bodies.
QUOTA_BYTES_PER_SECOND = "SESSIONMEM_QUOTA_BYTES_PER_SECOND"
# How many proxy worker processes of the Deployment, at most, split each agent's request and transfer rates
# (replicas x workers per replica; with an autoscaler, its maxReplicas): each worker keeps its share of
# every rate, so an agent's rate holds across the whole proxy Deployment, also when it scales.
QUOTA_RATE_SHARE = "SESSIONMEM_QUOTA_RATE_SHARE"

DEFAULT_QUOTA_CONVERSATIONS = 10_000
DEFAULT_QUOTA_BYTES = 256 * 1024 * 1024
DEFAULT_QUOTA_REQUESTS_PER_SECOND = 200
DEFAULT_QUOTA_BURST = 400
DEFAULT_QUOTA_BYTES_PER_SECOND = 4 * 1024 * 1024

# Standard OpenTelemetry variable: spans are exported by OTLP only when it is set.
OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
# The options of the jemalloc inside granian's Rust extension (tikv-jemallocator's prefixed MALLOC_CONF);
# the launcher sets LAUNCHER_JEMALLOC_CONF unless the variable is already set.
GRANIAN_JEMALLOC_CONF = "_RJEM_MALLOC_CONF"
# One arena, no thread caches, freed pages returned at once (jemalloc purges by decay only while it is
# allocating, so pages freed at the end of a burst would otherwise stay resident until the next one).
LAUNCHER_JEMALLOC_CONF = "narenas:1,tcache:false,dirty_decay_ms:0,muzzy_decay_ms:0"


class ConfigError(ValueError):
    """A setting is malformed; raised at start-up so a bad pod fails loudly instead of misbehaving."""


_N = TypeVar("_N", int, float)


def _number(env: Mapping[str, str], name: str, parse: Callable[[str], _N], what: str) -> _N | None:
    """The variable parsed by ``parse``; None when it is unset or empty."""
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return parse(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is not {what}") from exc


def _int(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    value = _number(env, name, int, "an integer")
    if value is None:
        return default
    if not lo <= value <= hi:
        raise ConfigError(f"{name}={value} is outside [{lo}, {hi}]")
    return value


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    value = _number(env, name, float, "a number")
    if value is None:
        return default
    if value <= 0:
        raise ConfigError(f"{name} must be positive")
    return value


def _choice(env: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str:
    """One of ``allowed``; unset or empty is the first, the default."""
    value = env.get(name) or allowed[0]
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} must be " + " or ".join(repr(a) for a in allowed))
    return value


def _bool(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise ConfigError(f"{name}={raw!r} is not a boolean")


@dataclass(frozen=True, slots=True)
class ServingLimits:
    """The serving limits of one listener, the proxy's and the launcher's alike (docs/limits.md)."""

    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_header_count: int = DEFAULT_MAX_HEADER_COUNT
    max_url_bytes: int = DEFAULT_MAX_URL_BYTES
    max_body_bytes: int = MAX_BODY_BYTES
    header_timeout_seconds: float = DEFAULT_HEADER_TIMEOUT_SECONDS
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS
    idle_timeout_seconds: float = DEFAULT_IDLE_TIMEOUT_SECONDS
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ServingLimits:
        return cls(
            # hyper refuses a read buffer under 8 KiB, and the whole request head must fit in it.
            max_header_bytes=_int(env, MAX_HEADER_BYTES, DEFAULT_MAX_HEADER_BYTES, 8192, 1024 * 1024),
            # hyper itself refuses more than 100 header fields.
            max_header_count=_int(env, MAX_HEADER_COUNT, DEFAULT_MAX_HEADER_COUNT, 1, 100),
            max_url_bytes=_int(env, MAX_URL_BYTES, DEFAULT_MAX_URL_BYTES, 64, 64 * 1024),
            max_body_bytes=_int(env, MAX_REQUEST_BODY_BYTES, MAX_BODY_BYTES, 1024, 64 * MAX_BODY_BYTES),
            header_timeout_seconds=_float(env, HEADER_TIMEOUT_SECONDS, DEFAULT_HEADER_TIMEOUT_SECONDS),
            body_timeout_seconds=_float(env, BODY_TIMEOUT_SECONDS, DEFAULT_BODY_TIMEOUT_SECONDS),
            idle_timeout_seconds=_float(env, IDLE_TIMEOUT_SECONDS, DEFAULT_IDLE_TIMEOUT_SECONDS),
            max_connections=_int(env, MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS, 1, 1_000_000),
        )


@dataclass(frozen=True, slots=True)
class LauncherSettings:
    # None only where memory is off; the launcher refuses to start without it (no direct-to-Valkey mode).
    proxy_url: str | None
    token_path: str
    namespace: str
    agent: str
    scope: str
    per_user: bool
    replay_messages: int
    replay_tokens: int | None
    cap: int
    ttl_seconds: int
    launcher_port: int
    serve_port: int
    agent_port: int
    proxy_timeout_seconds: float
    agent_timeout_seconds: float
    proxy_connect_timeout_seconds: float = DEFAULT_PROXY_CONNECT_TIMEOUT_SECONDS
    redact: tuple[str, ...] = ()
    summary_threshold: int = 0
    summarizer_url: str = "builtin"
    token_counter: str = "approx"
    # Serving limits of both listeners (docs/limits.md).
    limits: ServingLimits = ServingLimits()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LauncherSettings:
        env = os.environ if env is None else env
        scope = _choice(env, SCOPE, ("session", "shared"))
        tokens = _int(env, REPLAY_TOKENS, 0, 0, 10_000_000)
        return cls(
            proxy_url=(env.get(PROXY_URL) or None),
            token_path=env.get(TOKEN_PATH) or DEFAULT_TOKEN_PATH,
            namespace=env.get(NAMESPACE, ""),
            agent=env.get(AGENT, ""),
            scope=scope,
            per_user=_bool(env, PER_USER),
            replay_messages=_int(env, REPLAY_MESSAGES, DEFAULT_REPLAY_MESSAGES, 0, MAX_READ_LIMIT),
            replay_tokens=tokens or None,
            cap=_int(env, CAP, DEFAULT_CAP, 1, MAX_CAP),
            ttl_seconds=_int(env, TTL_SECONDS, DEFAULT_TTL_SECONDS, 1, MAX_TTL_SECONDS),
            launcher_port=_int(env, LAUNCHER_PORT, DEFAULT_LAUNCHER_PORT, 0, 65535),
            serve_port=_int(env, SERVE_PORT, DEFAULT_SERVE_PORT, 0, 65535),
            agent_port=_int(env, AGENT_PORT, DEFAULT_AGENT_PORT, 1, 65535),
            proxy_timeout_seconds=_float(env, PROXY_TIMEOUT_SECONDS, 1.5),
            agent_timeout_seconds=_float(env, AGENT_TIMEOUT_SECONDS, 120.0),
            proxy_connect_timeout_seconds=_float(
                env, PROXY_CONNECT_TIMEOUT_SECONDS, DEFAULT_PROXY_CONNECT_TIMEOUT_SECONDS
            ),
            redact=tuple(n.strip() for n in env.get(REDACT, "").split(",") if n.strip()),
            summary_threshold=_int(env, SUMMARY_THRESHOLD, 0, 0, MAX_CAP),
            summarizer_url=env.get(SUMMARIZER_URL) or "builtin",
            token_counter=env.get(TOKEN_COUNTER) or "approx",
            limits=ServingLimits.from_env(env),
        )


@dataclass(frozen=True, slots=True)
class ProxySettings:
    valkey_url: str
    auth_mode: str
    audience: str
    host: str
    port: int
    valkey_timeout_seconds: float
    capability_key_file: str | None
    capability_bucket_key_file: str | None
    capability_max_lifetime_seconds: int
    kube_api_server: str | None
    kube_ca_file: str | None
    kube_token_file: str | None
    membership_cache_seconds: float
    redact_patterns: str | None
    quota_conversations: int = DEFAULT_QUOTA_CONVERSATIONS
    quota_bytes: int = DEFAULT_QUOTA_BYTES
    quota_requests_per_second: float = float(DEFAULT_QUOTA_REQUESTS_PER_SECOND)
    quota_burst: int = DEFAULT_QUOTA_BURST
    quota_bytes_per_second: int = DEFAULT_QUOTA_BYTES_PER_SECOND
    quota_rate_share: int = 1
    limits: ServingLimits = ServingLimits()
    sealing_keyring: str | None = None
    sealing_key_store: str = "secret"
    sealing_namespace: str | None = None
    sealing_key_dir: str | None = None
    sealing_cache_seconds: float = 30.0
    sealing_opened_bytes: int = DEFAULT_SEALING_OPENED_BYTES

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ProxySettings:
        env = os.environ if env is None else env
        # Fail closed: without an explicit choice the proxy verifies tokens with TokenReview.
        mode = _choice(env, AUTH_MODE, ("tokenreview", "dev"))
        return cls(
            valkey_url=env.get(VALKEY_URL) or "valkey://127.0.0.1:6379/0",
            auth_mode=mode,
            audience=env.get(AUDIENCE) or DEFAULT_AUDIENCE,
            host=env.get(PROXY_HOST) or "0.0.0.0",
            port=_int(env, PROXY_PORT, 8000, 0, 65535),
            valkey_timeout_seconds=_float(env, VALKEY_TIMEOUT_SECONDS, 1.0),
            capability_key_file=env.get(CAPABILITY_KEY_FILE) or None,
            capability_bucket_key_file=env.get(CAPABILITY_BUCKET_KEY_FILE) or None,
            capability_max_lifetime_seconds=_int(
                env, CAPABILITY_MAX_LIFETIME_SECONDS, DEFAULT_CAPABILITY_MAX_LIFETIME_SECONDS, 1, 24 * 3600
            ),
            kube_api_server=env.get(KUBE_API_SERVER) or None,
            kube_ca_file=env.get(KUBE_CA_FILE) or None,
            kube_token_file=env.get(KUBE_TOKEN_FILE) or None,
            membership_cache_seconds=_float(env, MEMBERSHIP_CACHE_SECONDS, 10.0),
            redact_patterns=env.get(REDACT_PATTERNS) or None,
            quota_conversations=_int(env, QUOTA_CONVERSATIONS, DEFAULT_QUOTA_CONVERSATIONS, 1, 1 << 40),
            quota_bytes=_int(env, QUOTA_BYTES, DEFAULT_QUOTA_BYTES, 1, 1 << 50),
            quota_requests_per_second=_float(env, QUOTA_REQUESTS_PER_SECOND, float(DEFAULT_QUOTA_REQUESTS_PER_SECOND)),
            quota_burst=_int(env, QUOTA_BURST, DEFAULT_QUOTA_BURST, 1, 1 << 30),
            quota_bytes_per_second=_int(env, QUOTA_BYTES_PER_SECOND, DEFAULT_QUOTA_BYTES_PER_SECOND, 1, 1 << 50),
            quota_rate_share=_int(env, QUOTA_RATE_SHARE, 1, 1, 100_000),
            limits=ServingLimits.from_env(env),
            sealing_keyring=env.get(SEALING_KEYRING) or None,
            sealing_key_store=_choice(env, SEALING_KEY_STORE, ("secret", "directory")),
            sealing_namespace=env.get(SEALING_NAMESPACE) or None,
            sealing_key_dir=env.get(SEALING_KEY_DIR) or None,
            sealing_cache_seconds=_float(env, SEALING_CACHE_SECONDS, 30.0),
            sealing_opened_bytes=_int(env, SEALING_OPENED_BYTES, DEFAULT_SEALING_OPENED_BYTES, 0, 1 << 34),
        )
