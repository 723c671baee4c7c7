"""Kubernetes names shared by the operator, the proxy (identity) and the chart: API group, kinds,
labels, and the rule that ties an agent to its ServiceAccount.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

GROUP = "agents.ctxmesh.ai"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
AGENT_KIND = "AgentDeployment"
AGENT_PLURAL = "agentdeployments"
REGISTRY_KIND = "AgentRegistry"
REGISTRY_PLURAL = "agentregistries"

# Longest AgentDeployment name: Knative names revisions "<service>-00001" and those must stay DNS labels.
MAX_AGENT_NAME = 57

LABEL_AGENT = f"{GROUP}/agent"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "sessionmem-operator"

_SA_PREFIX = "sessionmem-"
_SA_USER_PREFIX = "system:serviceaccount:"


def agent_service_account(agent: str) -> str:
    """The per-agent ServiceAccount the operator creates and the proxy recognises as an agent identity."""
    return f"{_SA_PREFIX}{agent}"


def agent_from_service_account(service_account: str) -> str | None:
    """The agent name behind a ServiceAccount name, or None when it is not an agent identity."""
    if not service_account.startswith(_SA_PREFIX):
        return None
    agent = service_account[len(_SA_PREFIX) :]
    return agent or None


def parse_service_account_username(username: str) -> tuple[str, str] | None:
    """``system:serviceaccount:<namespace>:<name>`` -> (namespace, name), else None."""
    if not username.startswith(_SA_USER_PREFIX):
        return None
    parts = username[len(_SA_USER_PREFIX) :].split(":")
    if len(parts) != 2 or not all(parts):
        return None
    return parts[0], parts[1]


def registry_members(registry: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(namespace, name) of every AgentDeployment an AgentRegistry object lists."""
    members = (registry.get("spec") or {}).get("members") or []
    return {(str(m.get("namespace", "")), str(m.get("name", ""))) for m in members if isinstance(m, Mapping)}


def effective_registry(listing: Iterable[str]) -> str | None:
    """The registry whose shared scope an agent gets: the one registry that lists it. None when no
    registry or several do (ambiguous: the private layout is kept), so the operator (which renders the
    scope) and the proxy (which enforces it) always agree."""
    names = set(listing)
    return names.pop() if len(names) == 1 else None


def registry_for(namespace: str, agent: str, registries: Iterable[Mapping[str, Any]]) -> str | None:
    """``effective_registry`` over AgentRegistry objects."""
    return effective_registry(
        str(r["metadata"]["name"]) for r in registries if (namespace, agent) in registry_members(r)
    )
