"""The CustomResourceDefinitions, built from the shared contract so no bound or default is written twice.

``charts/sessionmem/crds/agentdeployment.yaml`` and ``.../agentregistry.yaml`` are generated from this module
(``make crds``: ``python -m sessionmem_operator.crds --write charts/sessionmem/crds``) straight into the folder
Helm installs them from; the top-level ``crds/`` is a symbolic link to it, so there is no copy to keep in
sync. ``--check DIR`` (``make crds-check``) and a unit test fail when the files are stale.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from sessionmem_core import env, kube
from sessionmem_core.api import BUILTIN_REDACTORS
from sessionmem_core.keys import DNS_LABEL_MAX, Scope
from sessionmem_operator.security import ADDABLE_CAPABILITIES
from sessionmem_operator.spec import BUILTIN_SUMMARIZER, DEFAULT_TOKEN_COUNTER

Schema = dict[str, Any]

# The Kubernetes rule for environment variable names (C_IDENTIFIER plus '-' and '.').
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# Names the operator or Knative set: a user value would be silently overwritten, so reject it up front.
RESERVED_ENV_PREFIX = "SESSIONMEM_"
KNATIVE_RESERVED_ENV = ("PORT", "K_SERVICE", "K_CONFIGURATION", "K_REVISION")
# Go-style durations restricted to h/m/s, so CEL's duration() can bound them and Python can parse them.
TTL_PATTERN = r"^([0-9]{1,6}h)?([0-9]{1,6}m)?([0-9]{1,7}s)?$"
DEFAULT_TTL = f"{env.DEFAULT_TTL_SECONDS // 3600}h"
# DNS-1035 label: AgentDeployment names become v1 Service names, which must start with a letter.
DNS_1035_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS_1123_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_1123_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# A Kubernetes resource quantity (resource.Quantity's serialised form).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
# "host:port" with a DNS name, an IPv4 address or a bracketed IPv6 address.
BACKEND_ADDR_PATTERN = r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?):[0-9]{1,5}$"
MAX_REPLAY_TOKENS = 10_000_000
# Redactor names an agent may opt into (the proxy's built-ins or names its SESSIONMEM_REDACT_PATTERNS defines).
REDACTOR_PATTERN = r"^[a-z][a-z0-9-]{0,31}$"
MAX_REDACTORS = 16
# "builtin", or an http(s) URL with a host (the launcher POSTs to it from inside the pod).
SUMMARIZER_ENDPOINT_PATTERN = rf"^({BUILTIN_SUMMARIZER}|https?://[^\s/?#@]+([/?#]\S*)?)$"
MIN_SUMMARY_THRESHOLD = 2
# "approx", or "package.module:function" importable in the launcher image.
TOKEN_COUNTER_PATTERN = rf"^({DEFAULT_TOKEN_COUNTER}|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$"
# Ports Knative's queue-proxy and autoscaler use inside every revision pod (knative.dev/serving reservedPorts).
KNATIVE_RESERVED_PORTS = (8012, 8013, 8022, 9090, 9091, 8008)

AGENT_SHORT_NAME = "agd"
REGISTRY_SHORT_NAME = "agreg"
CATEGORY = "sessionmem"


def _with(schema: Schema, description: str, extra: dict[str, Any], validations: list[dict[str, str]] | None) -> Schema:
    result = {**schema, "description": description, **extra}
    if validations:
        result["x-kubernetes-validations"] = validations
    return result


def string(description: str, *, validations: list[dict[str, str]] | None = None, **extra: Any) -> Schema:
    return _with({"type": "string"}, description, extra, validations)


def integer(description: str, **extra: Any) -> Schema:
    return _with({"type": "integer"}, description, extra, None)


def boolean(description: str, **extra: Any) -> Schema:
    return _with({"type": "boolean"}, description, extra, None)


def obj(
    description: str,
    properties: dict[str, Schema],
    *,
    required: list[str] | None = None,
    validations: list[dict[str, str]] | None = None,
) -> Schema:
    schema: Schema = {"type": "object", "description": description, "properties": properties}
    if required:
        schema["required"] = required
    return _with(schema, description, {}, validations)


def array(description: str, items: Schema, **extra: Any) -> Schema:
    return _with({"type": "array", "items": items}, description, extra, None)


def rule(expression: str, message: str, **extra: str) -> dict[str, str]:
    return {"rule": expression, "message": message, **extra}


def _type_meta() -> dict[str, Schema]:
    return {
        "apiVersion": string(
            f"APIVersion defines the versioned schema of this representation of an object (here {kube.API_VERSION})."
        ),
        "kind": string("Kind is the REST resource this object represents."),
        # The API server forbids anything but a type here; kubectl explain shows ObjectMeta's own text.
        "metadata": {"type": "object"},
    }


def _conditions(description: str = "Conditions Ready and MemoryReady.") -> Schema:
    condition = obj(
        "One aspect of the object's state, in the metav1.Condition format.",
        {
            "type": string(
                "Ready (mirrors the workload), MemoryReady (memory wiring resolved) or MembersWired (registry).",
                maxLength=316,
            ),
            "status": string("True, False or Unknown.", enum=["True", "False", "Unknown"]),
            "reason": string("A CamelCase word for the last transition, e.g. NotARegistryMember.", maxLength=1024),
            "message": string("A human-readable explanation of the last transition.", maxLength=32768),
            "lastTransitionTime": string("When the status last changed.", format="date-time"),
            "observedGeneration": integer(
                "metadata.generation of the object this condition was computed from.", format="int64", minimum=0
            ),
        },
        required=["type", "status", "lastTransitionTime"],
    )
    return array(
        description,
        condition,
        **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"], "maxItems": 8},
    )


def _quota_schema() -> Schema:
    return obj(
        "Per-agent limits the state-layer proxy enforces for this agent, overriding the chart's defaults "
        "(proxy.quota). Over a storage quota a write is refused with 507, over the request rate a call is "
        "refused with 429; only this agent is affected. Unset fields keep the chart's defaults.",
        {
            "maxConversations": integer(
                "How many conversations this agent may hold at once (a write that would start one more is "
                f"refused). Chart default: {env.DEFAULT_QUOTA_CONVERSATIONS}.",
                minimum=1,
                format="int64",
            ),
            "maxBytes": integer(
                "How many bytes of stored conversation this agent may hold in total. Chart default: "
                f"{env.DEFAULT_QUOTA_BYTES} ({env.DEFAULT_QUOTA_BYTES // (1024 * 1024)} MiB).",
                minimum=1,
                format="int64",
            ),
            "requestsPerSecond": integer(
                "Sustained memory calls per second this agent may make (the proxy allows short bursts above "
                f"it, up to the chart's proxy.quota.burst). Chart default: {env.DEFAULT_QUOTA_REQUESTS_PER_SECOND}.",
                minimum=1,
                format="int64",
            ),
            "bytesPerSecond": integer(
                "Sustained bytes per second this agent may move through the proxy: bodies it sends and "
                "answers it reads; exports are paced to it (docs/quotas.md). Chart default: "
                f"{env.DEFAULT_QUOTA_BYTES_PER_SECOND} ({env.DEFAULT_QUOTA_BYTES_PER_SECOND // (1024 * 1024)} MiB/s).",
                minimum=1,
                format="int64",
            ),
        },
    )


def _memory_schema() -> Schema:
    scopes = [scope.value for scope in Scope]
    return obj(
        "Conversation memory for this agent. Its presence is the switch: with it the operator adds the "
        "sessionmem launcher as a sidecar (serving port and a 127.0.0.1 memory endpoint) and a projected "
        "ServiceAccount token; without it the agent container serves alone. Adding or removing it rolls a "
        "new revision.",
        {
            "scope": string(
                "session: private memory of this agent (mem:<namespace>/<agent>:<conversationId>). shared: the "
                "team scratchpad of the AgentRegistry listing this agent (mem:shared:<registry>:<conversationId>); "
                "on an agent no registry lists, the private layout stays in effect and MemoryReady says why.",
                enum=scopes,
                default=Scope.SESSION.value,
            ),
            "perUser": boolean(
                "Give every end user a bucket of their own inside the agent's private memory, derived from a "
                "verified user identity (a signed run capability), never from a header the agent can set. "
                "Session scope only.",
                default=False,
            ),
            "backend": obj(
                "Deprecated and ignored: the launcher always reaches memory through the state-layer proxy, "
                "which owns the backend (the chart's valkey or externalValkey). When set, MemoryReady carries "
                "the reason BackendAddrIgnored and a Warning Event says so.",
                {
                    "addr": string(
                        "Valkey address as host:port (a DNS name, an IPv4 address or a bracketed IPv6 address).",
                        pattern=BACKEND_ADDR_PATTERN,
                        maxLength=261,
                        validations=[
                            # Guarded by the pattern's port shape so a malformed value gets one error.
                            rule(
                                "!self.matches(':[0-9]{1,5}$') || "
                                "(int(self.substring(self.lastIndexOf(':') + 1)) >= 1 && "
                                "int(self.substring(self.lastIndexOf(':') + 1)) <= 65535)",
                                "spec.sessionMemory.backend.addr must end with a port between 1 and 65535",
                            )
                        ],
                    ),
                },
                required=["addr"],
            ),
            "replayMessages": integer(
                "How many of the latest messages the launcher replays to the agent before each request.",
                default=env.DEFAULT_REPLAY_MESSAGES,
                minimum=0,
                maximum=env.MAX_READ_LIMIT,
            ),
            "replayTokens": integer(
                "Optional token budget for the replayed messages: older messages are dropped first until the "
                "replay fits. Unset means no budget (only replayMessages applies).",
                minimum=1,
                maximum=MAX_REPLAY_TOKENS,
            ),
            "tokenCounter": string(
                f"How replayed messages are counted against replayTokens (unused without it). {DEFAULT_TOKEN_COUNTER} "
                "(default): a character-based estimate. Otherwise package.module:function, a callable from text "
                "to a token count that must be importable in the launcher image (the launcher is a sidecar with "
                "its own image, not the agent's); the launcher fails at start if it is not.",
                default=DEFAULT_TOKEN_COUNTER,
                pattern=TOKEN_COUNTER_PATTERN,
                maxLength=256,
            ),
            "maxEntries": integer(
                "Stored cap: the newest entries kept per conversation (older ones are trimmed on write).",
                default=env.DEFAULT_CAP,
                minimum=1,
                maximum=env.MAX_CAP,
            ),
            "ttl": string(
                "How long a conversation is kept after its last write (refreshed on every write, not on reads), "
                "as a duration in hours, minutes and seconds, e.g. 24h, 90m, 1h30m. At least 1s, at most 720h.",
                default=DEFAULT_TTL,
                pattern=TTL_PATTERN,
                minLength=2,
                maxLength=24,
                validations=[
                    rule(
                        # Guarded by the pattern so a malformed value gets one error, not two.
                        f"!self.matches('{TTL_PATTERN}') || "
                        f"(duration(self) >= duration('1s') && "
                        f"duration(self) <= duration('{env.MAX_TTL_SECONDS}s'))",
                        f"spec.sessionMemory.ttl must be between 1s and {env.MAX_TTL_SECONDS // 3600}h",
                    )
                ],
            ),
            "redact": array(
                "Redactors the proxy applies to every message before anything is stored (what is replayed, "
                f"exported or summarised is the redacted text): built-in {', '.join(BUILTIN_REDACTORS)}, or a "
                "name the proxy's SESSIONMEM_REDACT_PATTERNS defines (the chart value proxy.redactPatterns). A "
                "write naming an unknown redactor is refused, so nothing is stored unredacted; the operator "
                "reports such a name as MemoryReady=False, reason UnknownRedactor. Empty or unset: nothing is "
                "redacted.",
                string(
                    "A redactor name: lowercase letters, digits and '-', starting with a letter, at most 32.",
                    pattern=REDACTOR_PATTERN,
                    maxLength=32,
                ),
                maxItems=MAX_REDACTORS,
                **{"x-kubernetes-list-type": "set"},
            ),
            "quota": _quota_schema(),
            "summary": obj(
                "Rolling summary (session scope only): when a conversation holds more than threshold entries, the "
                "launcher folds everything older than the replay window into one summary entry, in the "
                "background, and replays that summary before the window. Unset, or without threshold: off.",
                {
                    "threshold": integer(
                        "Entries a conversation may hold before it is summarised. At least "
                        f"{MIN_SUMMARY_THRESHOLD}, greater than replayMessages (the window is kept as it is) and "
                        "less than maxEntries (the stored cap trims a conversation before it could pass it). "
                        "Unset: no summaries.",
                        minimum=MIN_SUMMARY_THRESHOLD,
                        maximum=env.MAX_CAP,
                    ),
                    "endpoint": string(
                        f"Who writes the summary. {BUILTIN_SUMMARIZER} (default): the launcher's trivial built-in "
                        "summariser (keeps what the user said, oldest first, bounded). Otherwise an http(s) URL on "
                        "the agent side, usually the agent container in the same pod (e.g. "
                        f"http://127.0.0.1:{env.DEFAULT_AGENT_PORT}/summarize), no user:password@: the launcher "
                        'POSTs {"previousSummary", "entries": [{role, content}]} and expects {"summary": "..."}.',
                        default=BUILTIN_SUMMARIZER,
                        pattern=SUMMARIZER_ENDPOINT_PATTERN,
                        maxLength=2048,
                    ),
                },
            ),
        },
        validations=[
            rule(
                "!(has(self.perUser) && self.perUser && has(self.scope) && self.scope == 'shared')",
                "spec.sessionMemory.perUser applies to session scope only (shared memory is the team's)",
                fieldPath=".perUser",
            ),
            rule(
                "!has(self.summary) || !has(self.scope) || self.scope == 'session'",
                "spec.sessionMemory.summary applies to session scope only (a rolling summary re-stamps authors, "
                "which would erase who wrote what in a shared scratchpad)",
                fieldPath=".summary",
            ),
            rule(
                "!has(self.summary) || !has(self.summary.threshold) || self.summary.threshold > "
                f"(has(self.replayMessages) ? self.replayMessages : {env.DEFAULT_REPLAY_MESSAGES})",
                "spec.sessionMemory.summary.threshold must be greater than spec.sessionMemory.replayMessages "
                "(the replay window is kept; only what lies beyond it is summarised)",
                fieldPath=".summary.threshold",
            ),
            rule(
                "!has(self.summary) || !has(self.summary.threshold) || self.summary.threshold < "
                f"(has(self.maxEntries) ? self.maxEntries : {env.DEFAULT_CAP})",
                "spec.sessionMemory.summary.threshold must be less than spec.sessionMemory.maxEntries "
                "(the stored cap trims a conversation before it could pass the threshold)",
                fieldPath=".summary.threshold",
            ),
        ],
    )


def _quantities(description: str) -> Schema:
    quantity = {
        "x-kubernetes-int-or-string": True,
        "pattern": QUANTITY_PATTERN,
        "description": "A quantity, e.g. 500m or 1 (cpu), 256Mi (memory).",
    }
    return {
        "type": "object",
        "description": description,
        "additionalProperties": quantity,
        "maxProperties": 16,
    }


def _pod_placement_schemas() -> dict[str, Schema]:
    """What a real agent needs beyond its image, each accepted by a Deployment and by Knative (nodeSelector
    and tolerations behind Knative's kubernetes.podspec-nodeselector / -tolerations feature flags)."""
    name = string(
        "The name of a Secret in the AgentDeployment's namespace.", pattern=DNS_1123_SUBDOMAIN_PATTERN, maxLength=253
    )
    toleration = obj(
        "A taint this agent's pods tolerate (as in a pod spec).",
        {
            "key": string("The taint key; empty with operator Exists: every taint.", maxLength=316),
            "operator": string("Equal (default) or Exists.", enum=["Equal", "Exists"]),
            "value": string("The taint value (with Equal).", maxLength=63),
            "effect": string(
                "NoSchedule, PreferNoSchedule or NoExecute; empty: every effect.",
                enum=["NoSchedule", "PreferNoSchedule", "NoExecute"],
            ),
            "tolerationSeconds": integer("With NoExecute: how long the pod stays bound after the taint appears."),
        },
    )
    return {
        "resources": obj(
            "The agent container's compute resources, as in a container spec (the launcher's come from the "
            "operator's launcherResources).",
            {
                "requests": _quantities("Minimum resources, e.g. {cpu: 100m, memory: 256Mi}."),
                "limits": _quantities("Maximum resources, e.g. {memory: 512Mi}."),
            },
        ),
        "imagePullSecrets": array(
            "Secrets holding the registry credentials to pull the agent image.",
            obj(
                "A reference to a Secret of type kubernetes.io/dockerconfigjson.",
                {"name": copy.deepcopy(name)},
                required=["name"],
            ),
            maxItems=16,
            **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        ),
        "nodeSelector": {
            "type": "object",
            "description": "Node labels the agent's pods must run on (on Knative: the kubernetes.podspec-nodeselector "
            "feature flag must be enabled).",
            "additionalProperties": {"type": "string", "maxLength": 63},
            "maxProperties": 32,
        },
        "tolerations": array(
            "Taints the agent's pods tolerate (on Knative: the kubernetes.podspec-tolerations feature flag must be "
            "enabled).",
            toleration,
            maxItems=32,
        ),
        "envFrom": array(
            "Secrets whose keys become environment variables of the agent container (secret values stay out of "
            "the AgentDeployment). spec.env wins over a key of the same name.",
            obj(
                "One Secret to take variables from.",
                {
                    "secretRef": obj(
                        "The Secret.",
                        {
                            "name": copy.deepcopy(name),
                            "optional": boolean("Start even when the Secret does not exist (default false)."),
                        },
                        required=["name"],
                    )
                },
                required=["secretRef"],
            ),
            maxItems=16,
        ),
    }


def _security_context_schema() -> Schema:
    """The container securityContext fields Knative accepts (so a spec works under both models)."""
    addable = ", ".join(f"'{name}'" for name in ADDABLE_CAPABILITIES)

    def capability() -> Schema:
        return string("A Linux capability name, e.g. NET_BIND_SERVICE.", maxLength=64)

    return obj(
        "The agent container's security context. Unset, it runs as Pod Security 'restricted' asks: "
        "runAsNonRoot, no privilege escalation, every capability dropped, the RuntimeDefault seccomp profile. "
        "Each field set here replaces that default (e.g. runAsUser for an image without a numeric USER, or "
        "runAsNonRoot: false for one that must run as root, which a restricted namespace then refuses). The "
        "launcher sidecar always runs restricted, with a read-only root filesystem.",
        {
            "runAsNonRoot": boolean("Refuse to start the container as root (default true)."),
            "runAsUser": integer("The UID the container runs as (default: the image's USER).", minimum=0),
            "runAsGroup": integer("The GID the container runs as (default: the image's).", minimum=0),
            "allowPrivilegeEscalation": boolean("Whether a process may gain privileges (default false)."),
            "readOnlyRootFilesystem": boolean("Mount the container's root filesystem read-only (default false)."),
            "capabilities": obj(
                "Linux capabilities to add and drop (default: drop ALL).",
                {
                    "add": array(
                        f"Capabilities to add: only {', '.join(ADDABLE_CAPABILITIES)} (what Pod Security "
                        "'restricted' and Knative allow).",
                        capability(),
                        maxItems=len(ADDABLE_CAPABILITIES),
                    )
                    | {
                        "x-kubernetes-validations": [
                            rule(
                                f"self.all(c, c in [{addable}])",
                                f"spec.securityContext.capabilities.add may only hold {addable}",
                            )
                        ]
                    },
                    "drop": array("Capabilities to drop, e.g. ALL.", capability(), maxItems=64),
                },
            ),
            "seccompProfile": obj(
                "The seccomp profile (default RuntimeDefault).",
                {
                    "type": string(
                        "RuntimeDefault, Localhost or Unconfined.", enum=["RuntimeDefault", "Localhost", "Unconfined"]
                    ),
                    "localhostProfile": string("With type Localhost: the profile's path on the node.", maxLength=4096),
                },
                required=["type"],
            ),
        },
    )


def _env_schema() -> Schema:
    reserved = ", ".join(f"'{name}'" for name in KNATIVE_RESERVED_ENV)
    item = obj(
        "A static environment variable for the agent container (no valueFrom: Knative rejects it).",
        {
            "name": string(
                "Variable name. SESSIONMEM_* names are set by the operator and PORT/K_* by Knative: both reserved.",
                pattern=ENV_NAME_PATTERN,
                minLength=1,
                maxLength=256,
                validations=[
                    rule(
                        f"!self.startsWith('{RESERVED_ENV_PREFIX}')",
                        f"spec.env[].name must not start with {RESERVED_ENV_PREFIX}: the operator sets those",
                    ),
                    rule(
                        f"!(self in [{reserved}])",
                        "spec.env[].name must not be PORT, K_SERVICE, K_CONFIGURATION or K_REVISION: "
                        "Knative sets those",
                    ),
                ],
            ),
            "value": string("Variable value.", maxLength=32768),
        },
        required=["name"],
    )
    return array(
        "Extra environment variables for the agent container (kept small and static).",
        item,
        maxItems=64,
        **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )


def agent_deployment_schema() -> Schema:
    spec = obj(
        "The desired agent workload.",
        {
            "image": string(
                "Container image of the agent, e.g. ghcr.io/my-org/support-agent:1.4.0.",
                minLength=1,
                maxLength=1024,
                pattern=r"^\S+$",
            ),
            "executionModel": string(
                "serving: a Knative Service (scale to zero, a new revision per change). deployment: an apps/v1 "
                "Deployment plus a v1 Service, for clusters without Knative.",
                enum=["serving", "deployment"],
                default="serving",
            ),
            "port": integer(
                f"The port the agent process listens on, given to it as $PORT. Unset: {env.DEFAULT_SERVE_PORT} "
                f"without sessionMemory (the agent serves), {env.DEFAULT_AGENT_PORT} with it (the launcher "
                f"serves {env.DEFAULT_SERVE_PORT} and forwards here).",
                minimum=1,
                maximum=65535,
            ),
            "env": _env_schema(),
            "securityContext": _security_context_schema(),
            **_pod_placement_schemas(),
            "sessionMemory": _memory_schema(),
        },
        required=["image"],
        validations=[
            rule(
                f"!has(self.sessionMemory) || !has(self.port) || "
                f"(self.port != {env.DEFAULT_SERVE_PORT} && self.port != {env.DEFAULT_LAUNCHER_PORT})",
                f"spec.port must not be {env.DEFAULT_SERVE_PORT} or {env.DEFAULT_LAUNCHER_PORT} with "
                "sessionMemory: the launcher sidecar listens there",
                fieldPath=".port",
            ),
            rule(
                f"!has(self.port) || self.executionModel != 'serving' || "
                f"!(self.port in [{', '.join(str(p) for p in KNATIVE_RESERVED_PORTS)}])",
                "spec.port must not be one of the ports Knative reserves in every revision pod "
                f"({', '.join(str(p) for p in KNATIVE_RESERVED_PORTS)})",
                fieldPath=".port",
            ),
        ],
    )
    status = obj(
        "What the operator observed and made.",
        {
            "observedGeneration": integer(
                "The metadata.generation the operator last reconciled.", format="int64", minimum=0
            ),
            "conditions": _conditions(),
            "scope": string(
                "The memory scope in effect (may differ from the requested one: shared needs registry "
                "membership). Unset when sessionMemory is off.",
                enum=[scope.value for scope in Scope],
            ),
            "registry": string("The AgentRegistry whose shared memory is in effect.", maxLength=DNS_LABEL_MAX),
            "keyPrefix": string("The key prefix of this agent's conversations, e.g. mem:my-team/support-agent:."),
            "workload": obj(
                "The object running the agent.",
                {
                    "apiVersion": string("API version of the workload, e.g. serving.knative.dev/v1."),
                    "kind": string("Kind of the workload: Service (Knative) or Deployment."),
                    "name": string("Name of the workload (the AgentDeployment's name)."),
                },
            ),
            "latestRevision": string("The latest Knative revision created for this agent (serving only)."),
            "url": string("Where the agent is reachable: the Knative URL, or the in-cluster Service URL."),
        },
    )
    return obj(
        "An agent workload with optional conversation memory. The operator renders a Knative Service (or a "
        "Deployment and Service), a per-agent ServiceAccount, and the memory wiring.",
        {**_type_meta(), "spec": spec, "status": status},
        required=["spec"],
        # No fieldPath: the API server accepts none under metadata, so the messages name the field.
        validations=[
            rule(
                f"size(self.metadata.name) <= {kube.MAX_AGENT_NAME}",
                f"metadata.name must be at most {kube.MAX_AGENT_NAME} characters: Knative names revisions "
                f"<name>-00001, which must fit a {DNS_LABEL_MAX}-character DNS label",
            ),
            rule(
                f"self.metadata.name.matches('{DNS_1035_PATTERN}')",
                "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a "
                "letter): it names the agent's Service",
            ),
        ],
    )


def agent_registry_schema() -> Schema:
    member = obj(
        "An AgentDeployment in the team.",
        {
            "namespace": string(
                "Namespace of the AgentDeployment.", pattern=DNS_1123_PATTERN, minLength=1, maxLength=DNS_LABEL_MAX
            ),
            "name": string(
                "Name of the AgentDeployment.", pattern=DNS_1035_PATTERN, minLength=1, maxLength=kube.MAX_AGENT_NAME
            ),
        },
        required=["namespace", "name"],
    )
    spec = obj(
        "The team.",
        {
            "description": string("What the team is for.", maxLength=1024),
            "members": array(
                "The AgentDeployments that share this registry's memory (those with sessionMemory.scope shared). "
                "An agent listed in more than one registry keeps its private layout.",
                member,
                default=[],
                maxItems=1000,
                **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["namespace", "name"]},
            ),
        },
    )
    status = obj(
        "What the operator observed.",
        {
            "observedGeneration": integer(
                "The metadata.generation the operator last handled.", format="int64", minimum=0
            ),
            "memberCount": integer("How many members spec.members lists.", minimum=0),
            "members": array(
                "The members the operator last wired (used to re-wire agents that were dropped).",
                obj(
                    "An AgentDeployment in the team.",
                    {
                        "namespace": string("Namespace of the AgentDeployment."),
                        "name": string("Name of the AgentDeployment."),
                    },
                ),
            ),
            "unreachableMembers": array(
                "Members outside the namespaces the operator watches (operator.watchNamespaces): not wired, "
                "they keep their private layout until their namespace is watched.",
                obj(
                    "An AgentDeployment the operator may not touch.",
                    {
                        "namespace": string("Namespace of the AgentDeployment."),
                        "name": string("Name of the AgentDeployment."),
                    },
                ),
            ),
            "keyPrefix": string("The key prefix of the team's shared conversations, e.g. mem:shared:<name>:."),
            "conditions": _conditions(
                "Condition MembersWired: True when every member is in a namespace the operator watches, else "
                "False naming the others and the chart value to change."
            ),
        },
    )
    return obj(
        "A team of agents sharing one memory space (the shared scope). Cluster-scoped: the shared key "
        "mem:shared:<registry>:<conversationId> carries no namespace, so the name must be unique cluster-wide.",
        {**_type_meta(), "spec": spec, "status": status},
        validations=[
            rule(
                f"size(self.metadata.name) <= {DNS_LABEL_MAX} && self.metadata.name.matches('{DNS_1123_PATTERN}')",
                f"metadata.name must be a DNS-1123 label (at most {DNS_LABEL_MAX} lowercase letters, digits "
                "and '-'): it becomes part of the shared key",
            )
        ],
    )


def _column(name: str, json_path: str, description: str, *, type_: str = "string", priority: int = 0) -> Schema:
    column: Schema = {"name": name, "type": type_, "jsonPath": json_path, "description": description}
    if priority:
        column["priority"] = priority
    return column


def _crd(
    *, kind: str, plural: str, singular: str, short_name: str, scope: str, schema: Schema, columns: list[Schema]
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{kube.GROUP}",
            "labels": {"app.kubernetes.io/part-of": "sessionmem"},
        },
        "spec": {
            "group": kube.GROUP,
            "scope": scope,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": [short_name],
                "categories": [CATEGORY],
            },
            "versions": [
                {
                    "name": kube.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def _condition_path(condition: str, field: str = "status") -> str:
    return f'.status.conditions[?(@.type=="{condition}")].{field}'


def agent_deployment_crd() -> dict[str, Any]:
    return _crd(
        kind=kube.AGENT_KIND,
        plural=kube.AGENT_PLURAL,
        singular=kube.AGENT_KIND.lower(),
        short_name=AGENT_SHORT_NAME,
        scope="Namespaced",
        schema=agent_deployment_schema(),
        columns=[
            _column("Model", ".spec.executionModel", "serving (Knative) or deployment."),
            _column("Scope", ".status.scope", "Memory scope in effect."),
            _column("Ready", _condition_path("Ready"), "The workload is up."),
            _column("Memory", _condition_path("MemoryReady"), "The memory wiring is resolved."),
            _column("Reason", _condition_path("MemoryReady", "reason"), "Why the wiring is what it is.", priority=1),
            _column("Revision", ".status.latestRevision", "Latest Knative revision.", priority=1),
            _column("URL", ".status.url", "Where the agent is reachable.", priority=1),
            _column("Age", ".metadata.creationTimestamp", "Time since creation.", type_="date"),
        ],
    )


def agent_registry_crd() -> dict[str, Any]:
    return _crd(
        kind=kube.REGISTRY_KIND,
        plural=kube.REGISTRY_PLURAL,
        singular=kube.REGISTRY_KIND.lower(),
        short_name=REGISTRY_SHORT_NAME,
        scope="Cluster",
        schema=agent_registry_schema(),
        columns=[
            _column("Members", ".status.memberCount", "How many agents the team lists.", type_="integer"),
            _column("Wired", _condition_path("MembersWired"), "Every member could be wired."),
            _column("Prefix", ".status.keyPrefix", "Key prefix of the shared memory.", priority=1),
            _column("Age", ".metadata.creationTimestamp", "Time since creation.", type_="date"),
        ],
    )


def apply_defaults(schema: Schema, value: Any) -> Any:
    """What the API server's structural defaulting does to `value` (a copy), for offline rendering: unset
    properties with a default get it, recursively; lists and explicit values are left as they are."""
    if not isinstance(value, dict) or schema.get("type") != "object":
        if isinstance(value, list) and isinstance(schema.get("items"), dict):
            return [apply_defaults(schema["items"], item) for item in value]
        return value
    result = dict(value)
    for name, prop in (schema.get("properties") or {}).items():
        if name not in result and "default" in prop:
            result[name] = copy.deepcopy(prop["default"])
        if name in result:
            result[name] = apply_defaults(prop, result[name])
    return result


HEADER = "# Generated by `make crds` (sessionmem_operator.crds) from sessionmem_core: do not edit.\n"

CRD_FILES = {"agentdeployment.yaml": agent_deployment_crd, "agentregistry.yaml": agent_registry_crd}


def render_yaml(crd: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(crd, sort_keys=False, width=120, allow_unicode=True)


def stale_files(folder: Path) -> list[str]:
    """The CRD files in `folder` that differ from what this module generates (or are missing)."""
    stale = []
    for file_name, build in CRD_FILES.items():
        path = folder / file_name
        if not path.is_file() or path.read_text(encoding="utf-8") != render_yaml(build()):
            stale.append(file_name)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--write", metavar="DIR", type=Path, help="write the CRD files into DIR (else print them)")
    target.add_argument("--check", metavar="DIR", type=Path, help="exit 1 if the CRD files in DIR are stale")
    args = parser.parse_args(argv)
    if args.check is not None:
        stale = stale_files(args.check)
        for file_name in stale:
            print(f"{args.check / file_name} is stale: run `make crds`", file=sys.stderr)
        return 1 if stale else 0
    for file_name, build in CRD_FILES.items():
        text = render_yaml(build())
        if args.write is None:
            sys.stdout.write("---\n" + text)
        else:
            (args.write / file_name).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
