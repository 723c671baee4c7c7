"""A small synchronous client for the Kubernetes REST API (httpx), enough for test set-up: discovery-based
resource resolution, server-side apply, get/delete, CRD waits, TokenRequest and TokenReview.

It is deliberately independent of kubernetes_asyncio so that fixtures can use it without an event loop."""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias
from urllib.parse import quote

import httpx
import yaml

JsonObject: TypeAlias = dict[str, Any]
Manifest: TypeAlias = Mapping[str, Any]
ManifestSource: TypeAlias = str | Path | Manifest

FIELD_MANAGER = "sessionmem-test-harness"


class KubeApiError(RuntimeError):
    """A non-2xx answer from the API server; `status` is the decoded metav1.Status when there is one."""

    def __init__(self, method: str, path: str, code: int, body: str) -> None:
        self.method = method
        self.path = path
        self.code = code
        self.body = body
        self.status: JsonObject = {}
        try:
            decoded = json.loads(body)
            if isinstance(decoded, dict):
                self.status = decoded
        except ValueError:
            pass
        super().__init__(f"{method} {path} -> HTTP {code}: {self.message or body[:2000]}")

    @property
    def reason(self) -> str:
        return str(self.status.get("reason", ""))

    @property
    def message(self) -> str:
        return str(self.status.get("message", ""))


@dataclass(frozen=True)
class ResourceInfo:
    api_version: str
    kind: str
    plural: str
    namespaced: bool

    def collection_path(self, namespace: str | None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced:
            if not namespace:
                raise ValueError(f"{self.kind} is namespaced: a namespace is needed")
            return f"{base}/namespaces/{quote(namespace, safe='')}/{self.plural}"
        return f"{base}/{self.plural}"

    def object_path(self, name: str, namespace: str | None) -> str:
        return f"{self.collection_path(namespace)}/{quote(name, safe='')}"


def load_manifests(sources: ManifestSource | Iterable[ManifestSource]) -> list[JsonObject]:
    """Accept a path, a YAML string, a dict, or an iterable of these; return the non-empty documents.

    A `str` is taken as YAML text when it contains a newline or a colon, else as a file path."""
    items: Iterable[ManifestSource] = [sources] if isinstance(sources, str | Path | Mapping) else sources
    docs: list[JsonObject] = []
    for item in items:
        if isinstance(item, Mapping):
            docs.append(dict(item))
            continue
        if isinstance(item, Path) or ("\n" not in item and ":" not in item):
            text = Path(item).read_text(encoding="utf-8")
        else:
            text = item
        for doc in yaml.safe_load_all(text):
            if doc is None:
                continue
            if not isinstance(doc, dict):
                raise ValueError(f"manifest document is not a mapping: {doc!r:.200}")
            if doc.get("kind") == "List" and isinstance(doc.get("items"), list):
                docs.extend(dict(i) for i in doc["items"])
            else:
                docs.append(doc)
    return docs


def crd_conditions(crd: Mapping[str, Any]) -> dict[str, JsonObject]:
    """A CRD's status conditions by type. A CRD read right after its creation may carry `status: null` or
    `status.conditions: null` (the API server has not set them yet): that is "no conditions", not an error."""
    status = crd.get("status") or {}
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    if not isinstance(conditions, list):
        return {}
    return {str(c.get("type")): dict(c) for c in conditions if isinstance(c, Mapping) and c.get("type")}


class KubeRestClient:
    def __init__(self, server_url: str, ca_path: Path, token: str, *, timeout: float = 30.0) -> None:
        self.server_url = server_url
        ctx = ssl.create_default_context(cafile=str(ca_path))
        self._http = httpx.Client(
            base_url=server_url,
            verify=ctx,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout,
        )
        self._discovery: dict[str, list[ResourceInfo]] = {}

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> KubeRestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- raw requests -------------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
        ok: Sequence[int] = (),
    ) -> httpx.Response:
        """Send a request; raise KubeApiError on a non-2xx status not listed in `ok`."""
        headers = {}
        content: bytes | None = None
        if body is not None:
            content = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        resp = self._http.request(method, path, content=content, headers=headers, params=params)
        if not resp.is_success and resp.status_code not in ok:
            raise KubeApiError(method, path, resp.status_code, resp.text)
        return resp

    def get_json(self, path: str) -> JsonObject:
        data = self.request("GET", path).json()
        if not isinstance(data, dict):
            raise TypeError(f"GET {path}: expected an object, got {type(data).__name__}")
        return data

    # ---- discovery ----------------------------------------------------------------------------------------

    def _resources(self, api_version: str, *, refresh: bool = False) -> list[ResourceInfo]:
        if refresh or api_version not in self._discovery:
            path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            resp = self.request("GET", path, ok=(404, 503))
            if not resp.is_success:
                self._discovery.pop(api_version, None)
                return []
            self._discovery[api_version] = [
                ResourceInfo(api_version, r["kind"], r["name"], bool(r["namespaced"]))
                for r in resp.json().get("resources", [])
                if "/" not in r["name"]
            ]
        return self._discovery[api_version]

    def resolve(self, api_version: str, kind: str, *, timeout: float = 15.0) -> ResourceInfo:
        """Map apiVersion+kind to a REST resource through discovery (retrying: a just-established CRD may
        take a moment to show up)."""
        deadline = time.monotonic() + timeout
        refresh = False
        while True:
            for info in self._resources(api_version, refresh=refresh):
                if info.kind == kind:
                    return info
            if time.monotonic() > deadline:
                raise LookupError(f"the API server does not serve kind {kind!r} in {api_version!r}")
            refresh = True
            time.sleep(0.2)

    # ---- objects ------------------------------------------------------------------------------------------

    def apply(self, doc: Manifest, *, namespace: str | None = None, field_manager: str = FIELD_MANAGER) -> JsonObject:
        """Create or update one object with server-side apply (force: the harness owns what it applies)."""
        api_version = str(doc.get("apiVersion", ""))
        kind = str(doc.get("kind", ""))
        meta = doc.get("metadata") or {}
        name = meta.get("name")
        if not api_version or not kind or not name:
            raise ValueError(f"manifest needs apiVersion, kind and metadata.name: {dict(doc)!r:.300}")
        info = self.resolve(api_version, kind)
        ns = (meta.get("namespace") or namespace or "default") if info.namespaced else None
        body = dict(doc)
        if ns is not None:
            body["metadata"] = {**meta, "namespace": ns}
        resp = self.request(
            "PATCH",
            info.object_path(str(name), ns),
            body=body,
            content_type="application/apply-patch+yaml",
            params={"fieldManager": field_manager, "force": "true"},
        )
        result = resp.json()
        assert isinstance(result, dict)
        return result

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> JsonObject | None:
        """The object, or None when it does not exist."""
        info = self.resolve(api_version, kind)
        resp = self.request("GET", info.object_path(name, namespace), ok=(404,))
        if resp.status_code == 404:
            return None
        result = resp.json()
        assert isinstance(result, dict)
        return result

    def create(self, doc: Manifest, *, namespace: str | None = None) -> JsonObject:
        """Plain POST (fails with 409 if it exists); useful when a test wants the server's create validation."""
        info = self.resolve(str(doc["apiVersion"]), str(doc["kind"]))
        meta = doc.get("metadata") or {}
        ns = (meta.get("namespace") or namespace or "default") if info.namespaced else None
        result = self.request("POST", info.collection_path(ns), body=dict(doc)).json()
        assert isinstance(result, dict)
        return result

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        propagation_policy: str = "Background",
    ) -> bool:
        """Delete; returns False when it was already gone."""
        info = self.resolve(api_version, kind)
        resp = self.request(
            "DELETE",
            info.object_path(name, namespace),
            body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation_policy},
            ok=(404,),
        )
        return resp.status_code != 404

    # ---- CRDs ---------------------------------------------------------------------------------------------

    def wait_for_crd_established(self, name: str, *, timeout: float = 30.0) -> JsonObject:
        """Wait until the CRD reports Established=True and its kind is served by discovery."""
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{quote(name, safe='')}"
        deadline = time.monotonic() + timeout
        crd: JsonObject = {}
        while time.monotonic() < deadline:
            resp = self.request("GET", path, ok=(404,))
            if resp.status_code == 200:
                crd = resp.json()
                conditions = crd_conditions(crd)
                if conditions.get("NamesAccepted", {}).get("status") == "False":
                    raise RuntimeError(f"CRD {name} names not accepted: {conditions['NamesAccepted']}")
                if conditions.get("Established", {}).get("status") == "True":
                    break
            time.sleep(0.1)
        else:
            raise TimeoutError(f"CRD {name} not Established after {timeout}s: {crd.get('status')}")
        spec = crd["spec"]
        group, kind = spec["group"], spec["names"]["kind"]
        for version in spec["versions"]:
            if version.get("served", True):
                self.resolve(f"{group}/{version['name']}", kind, timeout=max(deadline - time.monotonic(), 5.0))
        return crd

    # ---- tokens -------------------------------------------------------------------------------------------

    def ensure_service_account(self, namespace: str, name: str) -> JsonObject:
        return self.apply(
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}}
        )

    def mint_service_account_token(
        self,
        namespace: str,
        sa_name: str,
        audience: str | Sequence[str],
        expiration_seconds: int = 600,
    ) -> str:
        """Call the TokenRequest API (serviceaccounts/<name>/token) and return the signed JWT."""
        audiences = [audience] if isinstance(audience, str) else list(audience)
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": audiences, "expirationSeconds": expiration_seconds},
        }
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/serviceaccounts/{quote(sa_name, safe='')}/token"
        result = self.request("POST", path, body=body).json()
        token = result["status"]["token"]
        assert isinstance(token, str)
        return token

    def token_review(self, token: str, audiences: Sequence[str] | None = None) -> JsonObject:
        """POST a TokenReview; returns its `status` (authenticated, user, audiences, error)."""
        spec: JsonObject = {"token": token}
        if audiences is not None:
            spec["audiences"] = list(audiences)
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        result = self.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=body).json()
        status = result.get("status", {})
        assert isinstance(status, dict)
        return status
