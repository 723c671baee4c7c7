"""The operator's own Kubernetes calls: server-side apply, get, delete and status patches on the handful of
kinds it manages, addressed by REST path (no discovery round-trips, and a kind whose CRD is absent, e.g.
Knative on a cluster without it, is just a 404).

Credentials come from kubernetes_asyncio's loaders (in-cluster ServiceAccount, else $KUBECONFIG), the same
sources kopf's own login uses, into a private Configuration so nothing global is touched.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import kopf
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from sessionmem_core import env, kube
from sessionmem_core.env import ConfigError
from sessionmem_operator.render import KNATIVE_API_VERSION

FIELD_MANAGER = kube.MANAGED_BY
REQUEST_TIMEOUT_SECONDS = 30.0
_JSON = "application/json"
_APPLY = "application/apply-patch+yaml"
_MERGE = "application/merge-patch+json"
_JSON_PATCH = "application/json-patch+json"
_DEFAULT_KUBECONFIG = os.path.expanduser("~/.kube/config")
_POD_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True, slots=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def collection_path(self, namespace: str | None) -> str:
        """The list path: in one namespace, or across all (None) for a namespaced kind."""
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        return f"{base}/{self.plural}"

    def path(self, namespace: str | None, name: str, subresource: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced:
            if not namespace:
                raise ValueError(f"{self.kind} is namespaced: a namespace is needed")
            base += f"/namespaces/{quote(namespace, safe='')}"
        path = f"{base}/{self.plural}/{quote(name, safe='')}"
        return f"{path}/{subresource}" if subresource else path


SERVICE_ACCOUNT = Kind("v1", "ServiceAccount", "serviceaccounts")
SERVICE = Kind("v1", "Service", "services")
DEPLOYMENT = Kind("apps/v1", "Deployment", "deployments")
KNATIVE_SERVICE = Kind(KNATIVE_API_VERSION, "Service", "services")
AGENT_DEPLOYMENT = Kind(kube.API_VERSION, kube.AGENT_KIND, kube.AGENT_PLURAL)
AGENT_REGISTRY = Kind(kube.API_VERSION, kube.REGISTRY_KIND, kube.REGISTRY_PLURAL, namespaced=False)

KINDS: Mapping[tuple[str, str], Kind] = {
    (k.api_version, k.kind): k
    for k in (SERVICE_ACCOUNT, SERVICE, DEPLOYMENT, KNATIVE_SERVICE, AGENT_DEPLOYMENT, AGENT_REGISTRY)
}


def kind_of(api_version: str, kind: str) -> Kind:
    try:
        return KINDS[(api_version, kind)]
    except KeyError:
        raise ValueError(f"the operator does not manage {kind} in {api_version}") from None


class KubeError(Exception):
    """A non-2xx answer; `status` is the HTTP code, `reason`/`message` come from the metav1.Status body."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.status = status
        self.reason = ""
        self.message = body[:2000]
        try:
            decoded = json.loads(body)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            self.reason = str(decoded.get("reason", ""))
            self.message = str(decoded.get("message", self.message))
        super().__init__(f"{method} {path}: HTTP {status} {self.reason}: {self.message}")

    @property
    def retriable(self) -> bool:
        """Worth retrying soon: conflicts, throttling, server trouble (and 0: no answer at all)."""
        return self.status in (0, 409, 429) or self.status >= 500


async def load_configuration() -> Any:
    """In-cluster credentials when running in a pod, else the kubeconfig ($KUBECONFIG or ~/.kube/config).

    Without usable credentials: ConfigError saying where it looked and what to set (the operator exits
    with it rather than retrying a login that cannot succeed)."""
    configuration = k8s_client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except (k8s_config.ConfigException, OSError) as exc:
            raise ConfigError(f"no usable in-cluster credentials (the pod's ServiceAccount token): {exc}") from exc
        return configuration
    # $KUBECONFIG is read now: kubernetes_asyncio's own default was fixed when it was first imported.
    source = "$KUBECONFIG" if os.environ.get("KUBECONFIG") else "the default path"
    config_file = os.environ.get("KUBECONFIG") or _DEFAULT_KUBECONFIG
    fix = "set KUBECONFIG to a kubeconfig file with a current context, or run the operator in a pod"
    if not await asyncio.to_thread(os.path.isfile, config_file):
        raise ConfigError(
            f"no Kubernetes credentials: not in a pod, and no kubeconfig file at {config_file} ({source}); {fix}"
        )
    try:
        await k8s_config.load_kube_config(
            config_file=config_file, client_configuration=configuration, persist_config=False
        )
    except (k8s_config.ConfigException, OSError, TypeError, KeyError, ValueError) as exc:
        # The loader reports an empty or malformed file in several ways: all mean the file cannot be used.
        raise ConfigError(
            f"no Kubernetes credentials: the kubeconfig {config_file} ({source}) is unusable: {exc}; {fix}"
        ) from exc
    return configuration


def own_namespace() -> str | None:
    """The operator's namespace (SESSIONMEM_OPERATOR_NAMESPACE, else the pod's; None outside a pod):
    where Events about cluster-scoped objects go."""
    if os.environ.get(env.OPERATOR_NAMESPACE):
        return os.environ[env.OPERATOR_NAMESPACE]
    try:
        return Path(_POD_NAMESPACE_FILE).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


async def connection_info(configuration: Any) -> kopf.ConnectionInfo:
    """The same credentials for kopf's own watches, so the operator logs in exactly one way."""
    header = await configuration.get_api_key_with_prefix("BearerToken")
    scheme, _, token = str(header or "").rpartition(" ")
    return kopf.ConnectionInfo(
        server=str(configuration.host),
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme or ("Bearer" if token else None),
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        default_namespace=own_namespace(),
    )


def _as_applied(created: Mapping[str, Any], uid: str) -> list[dict[str, Any]]:
    """A JSON patch turning the operator's update entry of a just-created object into its apply entry
    (the same fields), guarded by the object's uid."""
    entries = [
        {**entry, "operation": "Apply"}
        if entry.get("manager") == FIELD_MANAGER and entry.get("operation") == "Update"
        else entry
        for entry in (created.get("metadata") or {}).get("managedFields") or ()
    ]
    return [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "replace", "path": "/metadata/managedFields", "value": entries},
    ]


class KubeApi:
    def __init__(self, configuration: Any) -> None:
        self._client = k8s_client.ApiClient(configuration=configuration)
        # Shows in API server audit logs and in managedFields of non-apply writes.
        self._client.user_agent = kube.MANAGED_BY

    @classmethod
    async def connect(cls) -> KubeApi:
        return cls(await load_configuration())

    async def close(self) -> None:
        await self._client.close()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        content_type: str = _JSON,
        query: list[tuple[str, str]] | None = None,
    ) -> dict[str, Any]:
        try:
            result = await self._client.call_api(
                path,
                method,
                query_params=query or [],
                header_params={"Accept": _JSON, "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                response_types_map={200: "object", 201: "object", 202: "object"},
                _return_http_data_only=True,
                _request_timeout=REQUEST_TIMEOUT_SECONDS,
            )
        except ApiException as exc:
            raise KubeError(method, path, int(exc.status or 0), str(exc.body or exc.reason or "")) from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise KubeError(method, path, 0, f"{type(exc).__name__}: {exc}") from exc
        return result if isinstance(result, dict) else {}

    async def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None when it (or its whole kind) does not exist."""
        try:
            return await self._call("GET", kind.path(namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def list_names(self, kind: Kind, namespace: str | None) -> list[tuple[str, str]]:
        """(namespace, name) of every object of `kind` in `namespace` (None: all namespaces), paged."""
        found: list[tuple[str, str]] = []
        token = ""
        while True:
            query = [("limit", "500")] + ([("continue", token)] if token else [])
            page = await self._call("GET", kind.collection_path(namespace), query=query)
            for item in page.get("items") or ():
                meta = item.get("metadata") or {}
                found.append((str(meta.get("namespace") or ""), str(meta.get("name"))))
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return found

    async def watch(
        self, kind: Kind, namespace: str | None, label_selector: str, timeout_seconds: int
    ) -> AsyncIterator[tuple[str | None, dict[str, Any]]]:
        """Every object of `kind` matching the selector as (None, object), then each change as (type, object)
        until the server ends the watch (after about `timeout_seconds`); the caller starts it again. A kind
        that is not served raises KubeError 404; a watch the server can no longer continue, KubeError 410."""
        path = kind.collection_path(namespace)
        selector = [("labelSelector", label_selector)]
        version = ""
        token = ""
        while True:  # the listing, paged
            query = [*selector, ("limit", "500")] + ([("continue", token)] if token else [])
            page = await self._call("GET", path, query=query)
            for item in page.get("items") or ():
                # Items of a list may omit their kind: the handlers read it.
                yield None, {"apiVersion": kind.api_version, "kind": kind.kind, **item}
            meta = page.get("metadata") or {}
            version = str(meta.get("resourceVersion") or version)
            token = str(meta.get("continue") or "")
            if not token:
                break
        query = [
            *selector,
            ("watch", "true"),
            ("resourceVersion", version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        try:
            response = await self._client.call_api(
                path,
                "GET",
                query_params=query,
                header_params={"Accept": _JSON},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _preload_content=False,
                _request_timeout=timeout_seconds + REQUEST_TIMEOUT_SECONDS,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise KubeError("WATCH", path, 0, f"{type(exc).__name__}: {exc}") from exc
        try:
            if response.status != 200:
                raise KubeError("WATCH", path, response.status, (await response.read()).decode(errors="replace"))
            async for line in response.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                event_type, body = str(event.get("type")), event.get("object") or {}
                if event_type == "ERROR":
                    raise KubeError("WATCH", path, int(body.get("code") or 0), json.dumps(body))
                if event_type != "BOOKMARK":
                    yield event_type, body
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise KubeError("WATCH", path, 0, f"{type(exc).__name__}: {exc}") from exc
        finally:
            response.release()

    async def apply(self, manifest: Mapping[str, Any], *, uid: str | None) -> dict[str, Any]:
        """Write a child the operator may write (ownership.py decided), pinned to the object it judged ours:
        `uid` is that object's uid, or None when none existed. Fail-closed either way: an object created or
        replaced by someone else since it was read is refused by the API server, never taken over.

        - `uid` given: server-side apply, forced (the operator owns every field it renders, and a field it
          stops rendering is removed), with the uid in the applied metadata, where it is immutable: on
          another incarnation the apply is refused (422); if the object is gone, it is created as below.
        - None: a plain create, refused (409 AlreadyExists) if the name was taken meanwhile; a server-side
          apply would have merged into such an object. The create records the fields as an update, so
          they are then handed to the operator's apply entry, exactly as an apply would have created them
          (otherwise a field it stops rendering would stay)."""
        meta = manifest["metadata"]
        kind = kind_of(str(manifest["apiVersion"]), str(manifest["kind"]))
        namespace, name = meta.get("namespace"), str(meta["name"])
        if uid is not None:
            try:
                return await self._apply_pinned(kind, manifest, uid)
            except KubeError as exc:
                # 409: the object is gone since it was read (deleted by hand, or by a test): create it.
                if exc.status != 409 or await self.get(kind, namespace, name) is not None:
                    raise
        return await self._create(kind, manifest)

    async def _apply_pinned(self, kind: Kind, manifest: Mapping[str, Any], uid: str) -> dict[str, Any]:
        meta = manifest["metadata"]
        return await self._call(
            "PATCH",
            kind.path(meta.get("namespace"), str(meta["name"])),
            body={**manifest, "metadata": {**meta, "uid": uid}},
            content_type=_APPLY,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
        )

    async def _create(self, kind: Kind, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """POST, then the fields to the apply entry, then the apply itself: the object ends as a server-side
        apply would have created it (three writes, on creation only), so later applies are no-ops."""
        meta = manifest["metadata"]
        namespace, name = meta.get("namespace"), str(meta["name"])
        created = await self._call(
            "POST", kind.collection_path(namespace), body=dict(manifest), query=[("fieldManager", FIELD_MANAGER)]
        )
        created_uid = str((created.get("metadata") or {}).get("uid"))
        try:
            # The update entry holds the defaulted fields too; the apply then lets go of those it does not set.
            await self._call(
                "PATCH",
                kind.path(namespace, name),
                body=_as_applied(created, created_uid),
                content_type=_JSON_PATCH,
                query=[("fieldManager", FIELD_MANAGER)],
            )
            return await self._apply_pinned(kind, manifest, created_uid)
        except KubeError:
            # Never leave an object whose fields the next apply could not remove: the next reconcile creates
            # it again.
            await self.delete(kind, namespace, name, uid=created_uid)
            raise

    async def delete(self, kind: Kind, namespace: str | None, name: str, *, uid: str | None = None) -> bool:
        """Delete (dependents in the background). With `uid`, only that incarnation of the object. Returns
        False when it was already gone."""
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        try:
            await self._call("DELETE", kind.path(namespace, name), body=options)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def patch_status(
        self, kind: Kind, namespace: str | None, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch the status subresource (None values remove fields)."""
        return await self._call(
            "PATCH",
            kind.path(namespace, name, "status"),
            body={"status": dict(status)},
            content_type=_MERGE,
            query=[("fieldManager", FIELD_MANAGER)],
        )
