"""How the clients send a :class:`~sessionmem_client._requests.Request`: by default over sessionmem's own
keep-alive HTTP/1.1 client (``sessionmem_infra.http_client``), or over httpx pieces the caller brings.

The default matters because every agent turn pays two memory calls: httpx costs more CPU per call to the
launcher than the launcher, the proxy and Valkey together (docs/benchmarks.md).
httpx stays for callers who need what it adds (their own transport, proxies, a mock in tests); it is
imported only then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from sessionmem_client._requests import IDEMPOTENCY_KEY_HEADER, CallOptions, Reply, Request, unreachable
from sessionmem_core import api
from sessionmem_core.api import query_string
from sessionmem_core.errors import InvalidRequest
from sessionmem_infra.http_client import BlockingHttpClient, HttpClient, HttpResponse

if TYPE_CHECKING:
    import httpx


IDEMPOTENCY_KEY_HEADER_BYTES = IDEMPOTENCY_KEY_HEADER.encode()
_IF_NONE_MATCH = api.IF_NONE_MATCH_HEADER.encode()
_PREFER = api.PREFER_HEADER.encode()
_ETAG = api.ETAG_HEADER.encode()


def _per_call(request: Request[Any]) -> tuple[tuple[bytes, bytes], ...]:
    """The headers that differ from call to call (not kept by ``_HeaderBytes``)."""
    extra: tuple[tuple[bytes, bytes], ...] = ()
    if request.idempotency_key is not None:
        extra += ((IDEMPOTENCY_KEY_HEADER_BYTES, request.idempotency_key.encode("ascii")),)
    if request.if_none_match is not None:
        extra += ((_IF_NONE_MATCH, request.if_none_match.encode("ascii")),)
    if request.prefer is not None:
        extra += ((_PREFER, request.prefer.encode("ascii")),)
    return extra


def _target(request: Request[Any]) -> str:
    if not request.params:
        return request.path
    return f"{request.path}?{query_string(request.params)}"


class _HeaderBytes:
    """The encoded headers of a lean transport's requests, kept: a client sends the same few requests over
    and over (every agent turn reads the same window and appends to the same conversation), and building
    the pairs afresh cost a share of every call. Kept per transport (a client and the
    ``with_turn`` clones that share its pool), not process-wide, so a turn handle goes with the clients that
    carried it; keyed by the options, so each clone sends its own; bounded, as each distinct turn and
    traceparent is a key."""

    __slots__ = ("_kept",)
    _MAX_KEPT = 64

    def __init__(self) -> None:
        self._kept: dict[tuple[CallOptions, bool, str | None, str | None], tuple[tuple[bytes, bytes], ...]] = {}

    def of(self, options: CallOptions, request: Request[Any]) -> tuple[tuple[bytes, bytes], ...]:
        has_body, traceparent = request.body is not None, options.traceparent_of(request)
        key = (options, has_body, request.if_match, traceparent)
        pairs = self._kept.get(key)
        if pairs is None:
            try:
                fields = options.header_fields(has_body, request.if_match, traceparent)
                pairs = tuple((name.encode(), value.encode("ascii")) for name, value in fields.items())
            except UnicodeEncodeError as exc:
                raise InvalidRequest("header values (turn handle, traceparent) must be ASCII") from exc
            if len(self._kept) >= self._MAX_KEPT:
                self._kept.clear()
            self._kept[key] = pairs
        return pairs


class _LeanErrors:
    """The typed errors of a call over sessionmem's HTTP client (a class, not a generator-based context
    manager: it runs on every call)."""

    __slots__ = ("_options", "_request")

    def __init__(self, options: CallOptions, request: Request[Any]) -> None:
        self._options, self._request = options, request

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, ValueError):  # a header value with a line break: refused before it is sent
            raise InvalidRequest(str(exc)) from exc
        if isinstance(exc, OSError):  # refused, broken, or HttpTimeout
            raise unreachable(self._options, self._request, exc) from exc


def _lean_reply(response: HttpResponse) -> Reply:
    if response.status < 400:
        return Reply(response.status, response.body, etag=response.header(_ETAG))
    return Reply(response.status, response.body, response.header(b"retry-after"))


def _httpx_reply(response: httpx.Response) -> Reply:
    return Reply(
        response.status_code, response.content, response.headers.get("retry-after"), response.headers.get("etag")
    )


def _httpx_arguments(options: CallOptions, request: Request[Any]) -> dict[str, Any]:
    return {
        "method": request.method,
        "url": options.url(request),
        "params": request.params,
        "content": request.body,
        "headers": options.headers(request),
    }


class SyncTransport(Protocol):
    def send(self, options: CallOptions, request: Request[Any]) -> Reply: ...

    def close(self) -> None: ...


class AsyncTransport(Protocol):
    async def send(self, options: CallOptions, request: Request[Any]) -> Reply: ...

    async def aclose(self) -> None: ...


class LeanSync:
    def __init__(self, base_url: str, timeout: float) -> None:
        self._http = BlockingHttpClient(base_url, timeout=timeout)
        self._headers = _HeaderBytes()

    def send(self, options: CallOptions, request: Request[Any]) -> Reply:
        headers = self._headers.of(options, request)
        if request.idempotency_key is not None or request.if_none_match is not None or request.prefer is not None:
            headers = (*headers, *_per_call(request))
        with _LeanErrors(options, request):
            response = self._http.request(request.method, _target(request), headers, request.body, request.retry_safe)
        return _lean_reply(response)

    def close(self) -> None:
        self._http.close()


class LeanAsync:
    def __init__(self, base_url: str, timeout: float) -> None:
        self._http = HttpClient(base_url, timeout=timeout)
        self._headers = _HeaderBytes()

    async def send(self, options: CallOptions, request: Request[Any]) -> Reply:
        headers = self._headers.of(options, request)
        if request.idempotency_key is not None or request.if_none_match is not None or request.prefer is not None:
            headers = (*headers, *_per_call(request))
        with _LeanErrors(options, request):
            response = await self._http.request(
                request.method, _target(request), headers, request.body, request.retry_safe
            )
        return _lean_reply(response)

    async def aclose(self) -> None:
        await self._http.aclose()


class HttpxSync:
    """Over an ``httpx.Client``: the caller's (not closed here), or one made around their transport."""

    def __init__(self, client: httpx.Client, owned: bool) -> None:
        self._http, self._owned = client, owned

    def send(self, options: CallOptions, request: Request[Any]) -> Reply:
        import httpx

        try:
            response = self._http.request(**_httpx_arguments(options, request))
        except (httpx.TransportError, OSError) as exc:
            raise unreachable(options, request, exc) from exc
        return _httpx_reply(response)

    def close(self) -> None:
        if self._owned:
            self._http.close()


class HttpxAsync:
    def __init__(self, client: httpx.AsyncClient, owned: bool) -> None:
        self._http, self._owned = client, owned

    async def send(self, options: CallOptions, request: Request[Any]) -> Reply:
        import httpx

        try:
            response = await self._http.request(**_httpx_arguments(options, request))
        except (httpx.TransportError, OSError) as exc:
            raise unreachable(options, request, exc) from exc
        return _httpx_reply(response)

    async def aclose(self) -> None:
        if self._owned:
            await self._http.aclose()


def sync_transport(
    base_url: str, timeout: float, transport: httpx.BaseTransport | None, http_client: httpx.Client | None
) -> SyncTransport:
    if http_client is not None:
        return HttpxSync(http_client, owned=False)
    if transport is not None:
        import httpx

        return HttpxSync(httpx.Client(timeout=httpx.Timeout(timeout), transport=transport), owned=True)
    return LeanSync(base_url, timeout)


def async_transport(
    base_url: str, timeout: float, transport: httpx.AsyncBaseTransport | None, http_client: httpx.AsyncClient | None
) -> AsyncTransport:
    if http_client is not None:
        return HttpxAsync(http_client, owned=False)
    if transport is not None:
        import httpx

        return HttpxAsync(httpx.AsyncClient(timeout=httpx.Timeout(timeout), transport=transport), owned=True)
    return LeanAsync(base_url, timeout)
