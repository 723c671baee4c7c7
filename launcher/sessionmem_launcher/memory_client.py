"""How the launcher reaches memory: the proxy over HTTP with the pod's token, or, when no proxy is
configured, the proxy's own routes in-process over a direct Valkey connection (the same code path, so
the two modes cannot drift apart)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sessionmem_core import api
from sessionmem_core.env import VALKEY_URL, LauncherSettings
from sessionmem_core.errors import BackendUnavailable, UserCapabilityRequired
from sessionmem_core.http_client import AsgiClient, HttpClient, HttpResponse
from sessionmem_core.telemetry import inject_traceparent

_CAPABILITY = api.USER_CAPABILITY_HEADER.encode()
_SCOPE = api.SCOPE_HEADER.encode()
# Set from the pod's configuration on every forwarded call, whatever the agent sent.
_POD_PARAMS = frozenset({api.SCOPE_PARAM, api.CAP_PARAM, api.TTL_PARAM, api.REDACT_PARAM})


@dataclass(frozen=True, slots=True)
class MemoryResponse:
    status: int
    body: bytes
    scope: str | None
    entries: int | None
    version: int | None


def _int_header(response: HttpResponse, name: str) -> int | None:
    value = response.header(name.encode())
    return int(value) if value is not None and value.isdigit() else None


class Transport(Protocol):
    """Sends one request; bounds it by the launcher's proxy timeout itself (raising an OSError or
    TimeoutError when it runs out)."""

    async def request(
        self, method: str, target: str, headers: Iterable[tuple[bytes, bytes]] = (), body: bytes | None = None
    ) -> HttpResponse: ...

    async def aclose(self) -> None: ...


class _TokenFile:
    """The pod's projected token as an ``Authorization`` value, read again only when ``stat`` of the path
    tells it changed: reading the file on every call cost more CPU than the rest of the header building.

    The kubelet rotates a projected token by pointing a symlink at a new directory, which ``os.stat``
    (following links) sees as another inode; an in-place rewrite changes mtime, ctime or size. The path is
    stat'ed before it is read, so a change landing between the two is seen again on the next call."""

    __slots__ = ("_path", "_seen", "_value")

    def __init__(self, path: Path) -> None:
        self._path = path
        self._seen: tuple[int, int, int, int, int] | None = None
        self._value = b""

    def authorization(self) -> bytes:
        try:
            st = os.stat(self._path)
            seen = (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if seen != self._seen:
                self._value = b"Bearer " + self._path.read_text().strip().encode()
                self._seen = seen
        except (OSError, UnicodeError) as exc:
            # Checked on every call: a token gone or unreadable is never masked by the cached copy.
            self._seen = None
            raise BackendUnavailable(f"pod token {self._path} is not readable") from exc
        return self._value


class MemoryClient:
    def __init__(
        self,
        settings: LauncherSettings,
        transport: Transport,
        *,
        send_token: bool = True,
        propagate_current_span: bool = True,
    ) -> None:
        self._settings = settings
        self._token = _TokenFile(Path(settings.token_path))
        self._send_token = send_token
        self._propagate_current_span = propagate_current_span
        self._http = transport
        # The pod's own parameters never change: encoded once, not on every forwarded call.
        self._write_query = api.query_string(self._write_params())
        self._read_query = api.query_string([(api.SCOPE_PARAM, settings.scope)])

    def _write_params(self) -> list[tuple[str, str]]:
        params = [
            (api.SCOPE_PARAM, self._settings.scope),
            (api.CAP_PARAM, str(self._settings.cap)),
            (api.TTL_PARAM, str(self._settings.ttl_seconds)),
        ]
        if self._settings.redact:
            params.append((api.REDACT_PARAM, ",".join(self._settings.redact)))
        return params

    async def call(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]],
        body: bytes | None,
        *,
        capability: str | None,
        traceparent: str | None,
        if_match: str | None = None,
    ) -> MemoryResponse:
        """Forward one memory operation. Scope, cap and TTL are the pod's configuration, whatever the
        agent passed; the identity is the pod's token, re-read whenever the file changed (the kubelet rotates it)."""
        if self._settings.per_user and capability is None:
            # Without the user's capability this agent's memory would mix users: refuse, never fall back.
            raise UserCapabilityRequired(
                f"this agent keeps memory per user: send the {api.USER_CAPABILITY_HEADER} header"
            )
        pod_query = self._write_query if method in ("POST", "PUT") else self._read_query
        agent_query = api.query_string([(k, v) for k, v in query if k not in _POD_PARAMS])
        target = f"{path}?{agent_query}&{pod_query}" if agent_query else f"{path}?{pod_query}"
        trace: dict[str, str] = {}
        if self._propagate_current_span:
            inject_traceparent(trace)
        if "traceparent" not in trace and traceparent:
            trace["traceparent"] = traceparent
        headers = [(b"content-type", b"application/json"), *((k.encode(), v.encode()) for k, v in trace.items())]
        if self._send_token:
            headers.append((b"authorization", self._token.authorization()))
        if capability is not None:
            headers.append((_CAPABILITY, capability.encode("latin-1")))
        if if_match is not None:
            headers.append((b"if-match", if_match.encode("latin-1")))
        try:
            # The transport bounds the call (SESSIONMEM_PROXY_TIMEOUT_SECONDS): a timeout per call here
            # would arm and cancel a loop timer on every forwarded operation.
            response = await self._http.request(method, target, headers, body)
        except (OSError, UnicodeError) as exc:  # HttpTimeout is an OSError too
            raise BackendUnavailable(f"memory proxy unreachable: {type(exc).__name__}") from exc
        return MemoryResponse(
            status=response.status,
            body=response.body,
            scope=response.header(_SCOPE),
            entries=_int_header(response, api.ENTRIES_HEADER),
            version=_int_header(response, api.VERSION_HEADER),
        )

    async def aclose(self) -> None:
        await self._http.aclose()


def memory_client_from_settings(settings: LauncherSettings) -> MemoryClient:
    if settings.proxy_url:
        return MemoryClient(settings, HttpClient(settings.proxy_url, timeout=settings.proxy_timeout_seconds))
    if settings.backend_addr:
        return _direct_client(settings)
    raise ValueError("the launcher needs a proxy URL or a backend address")


def _direct_client(settings: LauncherSettings) -> MemoryClient:
    # Imported only in direct mode: a launcher behind the proxy never loads FastAPI.
    from opentelemetry.trace import NoOpTracerProvider

    from sessionmem_core.env import ProxySettings
    from sessionmem_core.keys import Owner
    from sessionmem_proxy.app import create_app
    from sessionmem_proxy.identity import AgentIdentity, FixedIdentityAuthenticator

    proxy_settings = ProxySettings.from_env({VALKEY_URL: f"valkey://{settings.backend_addr}/0"})
    identity = AgentIdentity(owner=Owner(namespace=settings.namespace, agent=settings.agent))
    # The launcher already traces each operation; the in-process routes must not add a second span.
    app = create_app(
        proxy_settings,
        authenticator=FixedIdentityAuthenticator(identity),
        tracer_provider=NoOpTracerProvider(),
    )
    client = AsgiClient(app, timeout=settings.proxy_timeout_seconds)
    return MemoryClient(settings, client, send_token=False, propagate_current_span=False)
