"""The launcher's HTTP serving (granian, with the launcher's own body limit) and its HTTP/1.1 client, at the
edges a general library would cover."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import orjson
import pytest

from sessionmem_core import api
from sessionmem_core.env import LauncherSettings, ServingLimits
from sessionmem_core.errors import SessionMemError
from sessionmem_infra.http_client import HttpClient, HttpError
from sessionmem_infra.serving import respond, respond_error
from sessionmem_launcher.server import Launcher
from sessionmem_launcher.serving import ListenerLimits
from tests.support.serving import serve_in_background
from tests.support.valkey import free_port


async def _echo(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
    message = await receive()
    body = orjson.dumps(
        {
            "path": scope["path"],
            "query": scope["query_string"].decode(),
            "body": message["body"].decode(),
            "client": scope["client"][1],
        }
    )
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


class _LimitedEcho:
    """Echoes the body it read through the launcher's own limits."""

    def __init__(self, limits: ServingLimits) -> None:
        self._limits = ListenerLimits(limits)

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        try:
            self._limits.requests.check_head(scope)
            body = await self._limits.read_body(scope, proto)
            self._limits.admit()
        except SessionMemError as exc:
            respond_error(proto, exc)
            return
        respond(proto, 200, orjson.dumps({"path": scope.path, "body": body.decode()}))


async def _raw(port: int, request: bytes, until: bytes = b"\r\n\r\n") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    data = b""
    while until not in data:
        chunk = await asyncio.wait_for(reader.read(65536), 5)
        if not chunk:
            break
        data += chunk
    writer.close()
    return data


async def test_keep_alive_reuses_one_connection_and_decodes_the_path() -> None:
    server = await serve_in_background(_echo)
    client = HttpClient(f"http://127.0.0.1:{server.port}")
    try:
        first = await client.request("POST", "/a%3Fb?x=1", [], b"hello")
        second = await client.request("GET", "/again")
    finally:
        await client.aclose()
        await server.stop()
    connection = orjson.loads(first.body).pop("client")
    assert orjson.loads(first.body) == {"path": "/a?b", "query": "x=1", "body": "hello", "client": connection}
    assert orjson.loads(second.body)["path"] == "/again"
    assert orjson.loads(second.body)["client"] == connection, "both requests went over one kept-alive connection"


async def test_chunked_bodies_expect_continue_malformed_requests_and_the_size_limit() -> None:
    # A body declared over the limit is read and dropped until the body timeout (it never comes here).
    server = await serve_in_background(_LimitedEcho(ServingLimits(max_body_bytes=16, body_timeout_seconds=1)))
    try:
        chunked = await _raw(
            server.port,
            b"POST /c HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            until=b'"body":"abc"',
        )
        expect = await _raw(
            server.port,
            b"POST /e HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\nok",
            until=b'"body":"ok"',
        )
        malformed = await _raw(server.port, b"NOT HTTP AT ALL\r\n\r\n")
        too_large = await _raw(server.port, b"POST /big HTTP/1.1\r\nhost: x\r\ncontent-length: 17\r\n\r\n")
        # granian leaves a value it cannot decode out of the fields it hands over: refused, never absent.
        latin1 = await _raw(server.port, b"GET /h HTTP/1.1\r\nhost: x\r\nx-sessionmem-turn: t\xe9\r\n\r\n")
    finally:
        await server.stop()
    assert chunked.startswith(b"HTTP/1.1 200 OK") and b'"body":"abc"' in chunked
    assert expect.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")
    # Refused by hyper before the launcher sees it: a 400 without a body (docs/limits-launcher.md).
    assert malformed.startswith(b"HTTP/1.1 400")
    assert too_large.startswith(b"HTTP/1.1 413") and b"payload_too_large" in too_large
    assert latin1.startswith(b"HTTP/1.1 400") and b"x-sessionmem-turn: the value is not visible ASCII" in latin1


async def test_client_errors_are_typed_and_a_dropped_keep_alive_connection_is_retried() -> None:
    with pytest.raises(HttpError):
        await HttpClient(f"http://127.0.0.1:{free_port()}").request("GET", "/")
    server = await serve_in_background(_echo)
    port = server.port
    client = HttpClient(f"http://127.0.0.1:{port}")
    try:
        await asyncio.gather(*(client.request("GET", "/one") for _ in range(3)))  # three pooled connections
        await server.stop()  # closes them, idle in the client's pool
        server = await serve_in_background(_echo, port=port)
        again = await client.request("GET", "/two")
    finally:
        await client.aclose()
        await server.stop()
    assert again.status == 200 and orjson.loads(again.body)["path"] == "/two"


async def _silent_peer() -> tuple[asyncio.Server, int]:
    """A server that accepts and reads a request but never answers."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        await asyncio.sleep(30)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _started_launcher(tmp_path: Any, environ: dict[str, str]) -> Launcher:
    token = tmp_path / "token"
    token.write_text("dev:team-a/support-agent")
    base = {
        "SESSIONMEM_TOKEN_PATH": str(token),
        "SESSIONMEM_NAMESPACE": "team-a",
        "SESSIONMEM_AGENT": "support-agent",
        "SESSIONMEM_LAUNCHER_PORT": "0",
        "SESSIONMEM_SERVE_PORT": "0",
    }
    launcher = Launcher(
        LauncherSettings.from_env({**base, **environ}), serve_host="127.0.0.1", serve=serve_in_background
    )
    await launcher.start()
    return launcher


async def test_a_proxy_that_accepts_but_never_answers_is_a_typed_503_after_the_proxy_timeout(tmp_path: Any) -> None:
    proxy, proxy_port = await _silent_peer()
    launcher = await _started_launcher(
        tmp_path,
        {"SESSIONMEM_PROXY_URL": f"http://127.0.0.1:{proxy_port}", "SESSIONMEM_PROXY_TIMEOUT_SECONDS": "0.3"},
    )
    client = HttpClient(f"http://127.0.0.1:{launcher.memory_port}", timeout=10)
    try:
        began = asyncio.get_running_loop().time()
        for _ in range(2):  # the second call goes over a fresh connection to the proxy, bounded the same
            answer = await client.request("GET", "/v1/conversations/c1/entries")
            assert answer.status == 503 and orjson.loads(answer.body)["error"]["type"] == "backend_unavailable"
        waited = asyncio.get_running_loop().time() - began
    finally:
        await client.aclose()
        await launcher.stop()
        proxy.close()
    assert 0.5 < waited < 3, waited


async def test_an_agent_that_never_answers_is_a_typed_502_after_the_agent_timeout(tmp_path: Any) -> None:
    agent, agent_port = await _silent_peer()
    launcher = await _started_launcher(
        tmp_path,
        {
            "SESSIONMEM_PROXY_URL": f"http://127.0.0.1:{free_port()}",  # memory fails open; the agent is asked
            "SESSIONMEM_AGENT_PORT": str(agent_port),
            "SESSIONMEM_AGENT_TIMEOUT_SECONDS": "0.3",
        },
    )
    client = HttpClient(f"http://127.0.0.1:{launcher.serve_port}", timeout=10)
    try:
        began = asyncio.get_running_loop().time()
        answer = await client.request(
            "POST", "/", [(api.CONVERSATION_ID_HEADER.encode(), b"c1")], orjson.dumps({"input": "hi"})
        )
        waited = asyncio.get_running_loop().time() - began
    finally:
        await client.aclose()
        await launcher.stop()
        agent.close()
    assert answer.status == 502 and orjson.loads(answer.body)["error"]["type"] == "agent_unavailable"
    assert 0.25 < waited < 3, waited
