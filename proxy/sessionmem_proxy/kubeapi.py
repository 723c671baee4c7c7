"""How the proxy reaches the Kubernetes API server (for TokenReview, SubjectAccessReview and registry
membership)."""

from __future__ import annotations

import os
import ssl
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from sessionmem_core.env import ProxySettings
from sessionmem_core.errors import AuthUnavailable

_INCLUSTER_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True, slots=True)
class KubeAPI:
    """Where and how the proxy reaches the API server."""

    server: str
    ca_path: str | None
    token_path: str | None = None
    token: str | None = None

    @classmethod
    def from_settings(cls, settings: ProxySettings) -> KubeAPI:
        """Explicit settings when given (out of cluster), else the pod's in-cluster configuration."""
        if settings.kube_api_server:
            return cls(
                server=settings.kube_api_server, ca_path=settings.kube_ca_file, token_path=settings.kube_token_file
            )
        return cls.in_cluster()

    def client(self, timeout_seconds: float = 2.0) -> httpx.AsyncClient:
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=self.ca_path) if self.ca_path else True
        return httpx.AsyncClient(base_url=self.server, verify=verify, timeout=timeout_seconds)

    @classmethod
    def in_cluster(cls) -> KubeAPI:
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise RuntimeError("not running in a cluster: KUBERNETES_SERVICE_HOST is unset")
        return cls(
            server=f"https://{host}:{port}",
            ca_path=str(_INCLUSTER_DIR / "ca.crt"),
            token_path=str(_INCLUSTER_DIR / "token"),
        )

    def bearer(self) -> str:
        if self.token is not None:
            return self.token
        if self.token_path is None:
            raise RuntimeError("no credential for the API server")
        # Re-read on every call: the kubelet rotates the proxy's own projected token.
        return Path(self.token_path).read_text().strip()

    async def review(self, http: httpx.AsyncClient, review: dict[str, Any], failures: Counter[str]) -> dict[str, Any]:
        """POST a review (a TokenReview, a SubjectAccessReview) with ``http`` and answer its ``status``.
        An API server that cannot be reached, or answers other than 200/201, is AuthUnavailable (a typed
        503, never a pass), counted under 'unavailable' in ``failures``."""
        group_version, kind = review["apiVersion"], review["kind"]
        try:
            response = await http.post(
                f"/apis/{group_version}/{kind.lower()}s",
                content=orjson.dumps(review),
                headers={"Authorization": f"Bearer {self.bearer()}", "Content-Type": "application/json"},
            )
        except (httpx.HTTPError, OSError) as exc:
            failures["unavailable"] += 1
            raise AuthUnavailable(f"{kind} unavailable: {type(exc).__name__}") from exc
        if response.status_code not in (200, 201):
            failures["unavailable"] += 1
            raise AuthUnavailable(f"{kind} answered HTTP {response.status_code}")
        status: dict[str, Any] = orjson.loads(response.content).get("status") or {}
        return status
