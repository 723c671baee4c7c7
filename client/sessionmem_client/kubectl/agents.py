"""AgentDeployments as the caller may read them, and what their status says of memory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client as kube_client
from kubernetes_asyncio.client.exceptions import ApiException

from sessionmem_client.kubectl.access import KubeAccess
from sessionmem_client.kubectl.errors import PluginError
from sessionmem_core import kube

MEMORY_READY = "MemoryReady"
# How the chart names the proxy's Service (its sessionmem.proxy.fullname).
PROXY_SERVICE_NAMING = "<release>-sessionmem-proxy, or <release>-proxy when the release name contains sessionmem"


@dataclass(frozen=True)
class AgentMemory:
    namespace: str
    name: str
    enabled: bool
    scope: str  # in effect, as the operator wired it (status.scope), "-" when none is (yet)
    requested_scope: str
    per_user: bool
    memory_ready: str
    reason: str
    message: str


def summarize(agent: dict[str, Any]) -> AgentMemory:
    """What `status` shows of one AgentDeployment. The scope is the one in effect, as `kubectl get agd`
    prints it: a `shared` request without registry membership runs with the private layout."""
    meta = agent.get("metadata") or {}
    memory = (agent.get("spec") or {}).get("sessionMemory")
    status = agent.get("status") or {}
    conditions = status.get("conditions") or []
    ready = next((c for c in conditions if isinstance(c, dict) and c.get("type") == MEMORY_READY), {})
    return AgentMemory(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        enabled=isinstance(memory, dict),
        scope=str(status.get("scope") or "-") if isinstance(memory, dict) else "-",
        requested_scope=str(memory.get("scope") or "session") if isinstance(memory, dict) else "-",
        per_user=bool((memory or {}).get("perUser")) if isinstance(memory, dict) else False,
        memory_ready=str(ready.get("status") or "Unknown"),
        reason=str(ready.get("reason") or ""),
        message=str(ready.get("message") or ""),
    )


def api_error(exc: ApiException, what: str) -> PluginError:
    """The API server's own words (``agentdeployments... is forbidden: User "x" cannot list ...``)."""
    try:
        message = str(json.loads(exc.body or "{}").get("message") or "")
    except (ValueError, AttributeError):
        message = ""
    titles = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound"}
    return PluginError(message or f"{what}: HTTP {exc.status} {exc.reason}", titles.get(exc.status or 0, "error"))


async def read_agents(access: KubeAccess, namespace: str | None, name: str | None) -> list[AgentMemory]:
    """One AgentDeployment (``name``), or every one of ``namespace`` (None: of every namespace)."""
    async with kube_client.ApiClient(configuration=access.configuration) as api_client:
        api = kube_client.CustomObjectsApi(api_client)
        try:
            if name is not None:
                assert namespace is not None
                found = await api.get_namespaced_custom_object(
                    kube.GROUP, kube.VERSION, namespace, kube.AGENT_PLURAL, name
                )
                return [summarize(found)]
            if namespace is None:
                listing = await api.list_cluster_custom_object(kube.GROUP, kube.VERSION, kube.AGENT_PLURAL)
            else:
                listing = await api.list_namespaced_custom_object(
                    kube.GROUP, kube.VERSION, namespace, kube.AGENT_PLURAL
                )
        except ApiException as exc:
            raise api_error(exc, f"reading {kube.AGENT_PLURAL}") from exc
        except OSError as exc:
            raise PluginError(f"cannot reach the API server: {exc}") from exc
    items = [summarize(item) for item in listing.get("items") or []]
    return sorted(items, key=lambda a: (a.namespace, a.name))


async def require_agent(access: KubeAccess, namespace: str, name: str) -> AgentMemory:
    """The AgentDeployment a memory command names. Fail-closed: a name that is no AgentDeployment (a typo
    most likely) is an error, never an empty answer or a receipt for nothing erased."""
    try:
        (found,) = await read_agents(access, namespace, name)
    except PluginError as exc:
        if exc.title == "NotFound":
            raise PluginError(
                f'no AgentDeployment "{name}" in namespace {namespace}: check the name and the namespace '
                f"(kubectl get agentdeployments -n {namespace})",
                "NotFound",
            ) from exc
        raise
    return found


async def proxy_service_port(access: KubeAccess, namespace: str, service: str) -> int:
    """The port of the proxy Service (its ``http`` port), as the caller may read it."""
    async with kube_client.ApiClient(configuration=access.configuration) as api_client:
        try:
            found = await kube_client.CoreV1Api(api_client).read_namespaced_service(service, namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise PluginError(
                    f"no Service {namespace}/{service}: pass --proxy-namespace and --proxy-service (the chart's "
                    f"release namespace and {PROXY_SERVICE_NAMING}), or --proxy-url",
                    "NotFound",
                ) from exc
            raise api_error(exc, f"reading Service {namespace}/{service}") from exc
        except OSError as exc:
            raise PluginError(f"cannot reach the API server: {exc}") from exc
    ports = found.spec.ports or []
    named = [p for p in ports if p.name == "http"] or ports
    if not named:
        raise PluginError(f"Service {namespace}/{service} has no port")
    return int(named[0].port)
