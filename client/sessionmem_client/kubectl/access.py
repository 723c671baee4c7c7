"""The caller's Kubernetes identity, read from their kubeconfig the way kubernetes_asyncio resolves it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client as kube_client
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.config.config_exception import ConfigException

from sessionmem_client.kubectl.errors import PluginError

BEARER = "Bearer "
NO_BEARER_TOKEN = (
    "your kubeconfig user authenticates with a client certificate (or a password), which the memory proxy "
    "cannot verify: it checks bearer tokens with TokenReview. Use a context whose user has a token, a "
    "tokenFile or an exec credential plugin (most managed clusters' default), or run with a short-lived "
    "token: kubectl create token <service-account> and a kubeconfig user with that token"
)


@dataclass
class KubeAccess:
    """What the plugin needs of the caller's kubeconfig: an API client configuration for reading
    AgentDeployments, the context's namespace and, for the proxy, the caller's bearer token."""

    configuration: Any
    namespace: str
    bearer_token: str | None
    kubeconfig: str | None
    context: str | None

    def require_bearer_token(self) -> str:
        if not self.bearer_token:
            raise PluginError(NO_BEARER_TOKEN)
        return self.bearer_token


async def load_access(kubeconfig: str | None, context: str | None) -> KubeAccess:
    configuration = kube_client.Configuration()
    try:
        loader = await kube_config.load_kube_config(
            config_file=kubeconfig, context=context, client_configuration=configuration, persist_config=False
        )
    except (ConfigException, OSError, AssertionError, KeyError) as exc:
        raise PluginError(f"cannot use your kubeconfig: {exc or type(exc).__name__}") from exc
    current: dict[str, Any] = loader.current_context or {}
    namespace = str((current.get("context") or {}).get("namespace") or "default")
    authorization = str(configuration.api_key.get("BearerToken") or "")
    token = authorization[len(BEARER) :] if authorization.startswith(BEARER) else None
    return KubeAccess(configuration, namespace, token or None, kubeconfig, context)
