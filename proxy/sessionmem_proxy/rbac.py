"""Who may administer memory. Administration of memory (inspect, export, erase an agent's or a user's
memory) is a person's act, authorised by Kubernetes RBAC: never an agent token's.

The caller presents their own Kubernetes bearer token (what kubectl sends). The proxy asks the API server
who it is (TokenReview under the API server's own audiences, not the proxy's: an agent's projected token
is not for those) and whether that person may act on the ``memory`` subresource of the AgentDeployment
(SubjectAccessReview: ``get`` to read, ``list`` to enumerate, ``delete`` to erase). Cluster operators grant
it with an ordinary Role, e.g. ``resources: [agentdeployments/memory], verbs: [get, list, delete]``.

Fail closed at every decision point: no or unknown token 401, an agent's own token or a person without the
permission 403, an API server that cannot be asked 503.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from sessionmem_core import kube
from sessionmem_core.errors import AuthUnavailable, Forbidden, Unauthenticated
from sessionmem_infra.serving import Rate, TokenBucket
from sessionmem_proxy.kubeapi import KubeAPI

MEMORY_SUBRESOURCE = "memory"
# The verbs an administrator's operation is checked with, by what it does.
READ, LIST, ERASE = "get", "list", "delete"
DEV_ADMIN_PREFIX = "dev-admin:"


@dataclass(frozen=True)
class Administrator:
    """A person the API server vouched for, with what SubjectAccessReview needs to ask about them."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict)


class AdminAuthorizer(Protocol):
    async def authorize(
        self, bearer_token: str | None, verb: str, namespace: str, agent: str | None, resource: str = kube.AGENT_PLURAL
    ) -> Administrator:
        """The administrator, when they may ``verb`` the memory of ``namespace/agent`` (of every agent in
        the namespace when ``agent`` is None; of the cluster-scoped AgentRegistry ``agent`` when
        ``resource`` is agentregistries and ``namespace`` is empty); typed errors otherwise."""
        ...


def denial(admin: Administrator, verb: str, namespace: str, name: str | None, resource: str) -> Forbidden:
    target = f"{resource}/{MEMORY_SUBRESOURCE}" + (f" {name!r}" if name else "")
    where = f" in namespace {namespace!r}" if namespace else ""
    return Forbidden(f"user {admin.username!r} cannot {verb} {target}{where}")


# Administrators' calls are a person's, at a person's pace: each costs the API server up to three reviews
# (nothing is cached, so a revoked permission stops at once), so all of them together may start at most
# ADMIN_RATE; beyond it a caller gets 503 auth_unavailable and the API server is not asked. A flood of
# garbage tokens on the admin routes costs it no more than that.
ADMIN_RATE = Rate(per_second=10.0, burst=20)


class KubeAdminAuthorizer:
    def __init__(self, http: httpx.AsyncClient, api: KubeAPI, agent_audience: str, *, rate: Rate = ADMIN_RATE) -> None:
        self._http = http
        self._api = api
        self._agent_audience = agent_audience
        self._rate = rate
        self._budget = TokenBucket(float(rate.burst), time.monotonic())
        # The administrators' TokenReviews by result (authenticated, rejected; unavailable counts any API
        # call that failed, SubjectAccessReviews included): the proxy's /metrics.
        self.reviews: Counter[str] = Counter()

    async def authorize(
        self, bearer_token: str | None, verb: str, namespace: str, agent: str | None, resource: str = kube.AGENT_PLURAL
    ) -> Administrator:
        if not bearer_token:
            raise Unauthenticated("missing bearer token")
        self._spend()
        status = await self._token_review(bearer_token, None)
        self.reviews["authenticated" if status.get("authenticated") else "rejected"] += 1
        if not status.get("authenticated"):
            # An agent's projected token is only valid under the proxy's audience: say plainly that agents
            # are not administrators instead of calling their valid token unknown.
            agent_status = await self._token_review(bearer_token, [self._agent_audience])
            if agent_status.get("authenticated"):
                raise Forbidden("memory administration is a person's act: an agent's token cannot do it")
            raise Unauthenticated("token rejected: " + str(status.get("error", "not authenticated"))[:200])
        user: dict[str, Any] = status.get("user") or {}
        admin = Administrator(
            username=str(user.get("username", "")),
            uid=str(user.get("uid", "")),
            groups=tuple(str(g) for g in user.get("groups") or ()),
            extra={str(k): [str(v) for v in vs] for k, vs in (user.get("extra") or {}).items()},
        )
        parsed = kube.parse_service_account_username(admin.username)
        if parsed is not None and kube.agent_from_service_account(parsed[1]) is not None:
            raise Forbidden("memory administration is a person's act: an agent's token cannot do it")
        if not await self._allowed(admin, verb, namespace, agent, resource):
            raise denial(admin, verb, namespace, agent, resource)
        return admin

    def _spend(self) -> None:
        if self._budget.take(time.monotonic(), self._rate.per_second, self._rate.burst):
            raise AuthUnavailable("too many administration calls: identity checks are rate limited, retry shortly")

    async def _token_review(self, token: str, audiences: list[str] | None) -> dict[str, Any]:
        spec: dict[str, Any] = {"token": token}
        if audiences:
            spec["audiences"] = audiences
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        return await self._api.review(self._http, review, self.reviews)

    async def _allowed(self, admin: Administrator, verb: str, namespace: str, agent: str | None, resource: str) -> bool:
        attributes = {"group": kube.GROUP, "resource": resource, "subresource": MEMORY_SUBRESOURCE, "verb": verb}
        if namespace:
            attributes["namespace"] = namespace
        if agent:
            attributes["name"] = agent
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": admin.username,
                "uid": admin.uid,
                "groups": list(admin.groups),
                "extra": admin.extra,
                "resourceAttributes": attributes,
            },
        }
        status = await self._api.review(self._http, review, self.reviews)
        return bool(status.get("allowed")) and not status.get("denied")


class DevAdminAuthorizer:
    """The explicit dev auth mode's administrator: ``dev-admin:<name>`` may do everything, nothing else
    may. Off unless the proxy runs with SESSIONMEM_AUTH_MODE=dev, which the chart never sets."""

    async def authorize(
        self, bearer_token: str | None, verb: str, namespace: str, agent: str | None, resource: str = kube.AGENT_PLURAL
    ) -> Administrator:
        if not bearer_token:
            raise Unauthenticated("missing bearer token")
        if not bearer_token.startswith(DEV_ADMIN_PREFIX) or len(bearer_token) == len(DEV_ADMIN_PREFIX):
            raise Forbidden("memory administration is a person's act: an agent's token cannot do it")
        return Administrator(username=bearer_token[len(DEV_ADMIN_PREFIX) :])
