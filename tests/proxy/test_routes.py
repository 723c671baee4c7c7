"""The proxy's route table, in process against a real valkey-server: every reply of every route matches
its wire model and a status the OpenAPI document lists; the committed document is current and lists
only statuses the server answers; the memory API's corners (issue #20 items 9 and 10)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx
import orjson
import pytest
from pydantic import BaseModel

from sessionmem_core import api, env, wire
from sessionmem_core.capability import mint_capability, new_key
from sessionmem_core.devauth import dev_token
from sessionmem_core.env import ProxySettings
from sessionmem_core.keys import Owner
from sessionmem_proxy.app import create_app
from sessionmem_proxy.openapi import COMMITTED, document, document_bytes
from sessionmem_proxy.operations import CAP, TTL, Param
from sessionmem_proxy.routes import ROUTES, ProxyApp, Route
from tests.support.serving import served_client
from tests.support.valkey import ValkeyProcess

AUTH = {"Authorization": f"Bearer {dev_token('team-a', 'support-agent')}"}
ADMIN = {"Authorization": "Bearer dev-admin:alice"}
CAPABILITY_KEY = new_key()
# A placeholder: the capability has a lifetime, so it is minted when a request carries it, never at import
# (on a slow machine the suite outlives a capability minted at collection).
ALICE = "<alice's capability, minted per request>"
EXCHANGE = {"entries": [{"role": "user", "content": "hello", "id": "m1"}]}
_AGENT_ADMIN = "/v1/admin/namespaces/team-a/agents/support-agent"

# Per operation: requests that succeed and requests that are refused, as (method, path, body, headers).
Call = tuple[str, str, Any, dict[str, str]]
CALLS: dict[str, list[Call]] = {
    "healthz": [("GET", "/healthz", None, {})],
    "readyz": [("GET", "/readyz", None, {})],
    "metrics": [("GET", "/metrics", None, {})],
    "openapi": [("GET", "/openapi.json", None, {})],
    "append": [
        ("POST", "/v1/conversations/c1/entries", EXCHANGE, AUTH),
        ("POST", "/v1/conversations/c1/entries?cap=0", EXCHANGE, AUTH),
        ("POST", "/v1/conversations/c1/entries", {"entries": []}, AUTH),
        ("POST", "/v1/conversations/c1/entries", EXCHANGE, {}),
        ("POST", "/v1/conversations/c1/entries", EXCHANGE, {"Authorization": "Bearer dev:nobody"}),
    ],
    "get": [
        ("GET", "/v1/conversations/c1/entries?limit=5&summary=true", None, AUTH),
        ("GET", "/v1/conversations/c1/entries?limit=501", None, AUTH),
        ("GET", "/v1/conversations/c1/entries?scope=team", None, AUTH),
        ("GET", "/v1/conversations/a:b/entries", None, AUTH),
    ],
    "search": [
        ("GET", "/v1/conversations/c1/search?q=hello", None, AUTH),
        ("GET", "/v1/conversations/c1/search", None, AUTH),
    ],
    "export": [("GET", "/v1/conversations/c1/export", None, AUTH), ("GET", "/v1/conversations/c1/export", None, {})],
    "info": [("GET", "/v1/conversations/c1", None, AUTH), ("GET", "/v1/conversations/c1?scope=x", None, AUTH)],
    "replace": [
        ("PUT", "/v1/conversations/c2", EXCHANGE, AUTH),
        ("PUT", "/v1/conversations/c2", EXCHANGE, {**AUTH, "If-Match": "99"}),
        ("PUT", "/v1/conversations/c2", EXCHANGE, {**AUTH, "If-Match": "abc"}),
    ],
    "delete": [
        ("DELETE", "/v1/conversations/c2", None, {**AUTH, "If-Match": "99"}),
        ("DELETE", "/v1/conversations/c2", None, AUTH),
        ("DELETE", "/v1/conversations/%FF", None, AUTH),
    ],
    "pop": [
        ("POST", "/v1/conversations/c3/pop", None, {**AUTH, "If-Match": "99"}),
        ("POST", "/v1/conversations/c3/pop", None, AUTH),
        ("POST", "/v1/conversations/c3/pop", None, {**AUTH, "If-Match": "abc"}),
    ],
    "rewind": [
        ("POST", "/v1/conversations/c3/rewind", {"toVersion": 0}, {**AUTH, "If-Match": "99"}),
        ("POST", "/v1/conversations/c3/rewind", {"toVersion": 0}, AUTH),
        ("POST", "/v1/conversations/c3/rewind", {"toVersion": -1}, AUTH),
    ],
    "metadata": [
        ("PATCH", "/v1/conversations/c1/metadata", {"title": "Trip", "labels": {"team": "a"}}, AUTH),
        ("PATCH", "/v1/conversations/never/metadata", {"title": "x"}, AUTH),
        ("PATCH", "/v1/conversations/c1/metadata", {"labels": {"bad label": "x"}}, AUTH),
    ],
    "compact": [
        (
            "POST",
            "/v1/conversations/c1/compact",
            {"summary": {"role": "system", "content": "s"}, "throughVersion": 1},
            AUTH,
        ),
        (
            "POST",
            "/v1/conversations/never/compact",
            {"summary": {"role": "system", "content": "s"}, "throughVersion": 0},
            AUTH,
        ),
        ("POST", "/v1/conversations/c1/compact", {"summary": {"role": "system", "content": "s"}}, AUTH),
    ],
    "fork": [
        ("POST", "/v1/conversations/c1/fork", {"conversationId": "c1-branch"}, AUTH),
        ("POST", "/v1/conversations/c1/fork", {"conversationId": "c1-branch"}, AUTH),
        ("POST", "/v1/conversations/c1/fork", {"conversationId": "a:b", "atVersion": 1}, AUTH),
    ],
    "list": [
        ("GET", "/v1/conversations?limit=2", None, AUTH),
        ("GET", "/v1/conversations?cursor=x", None, AUTH),
    ],
    "clear": [
        ("DELETE", "/v1/conversations?confirm=true", None, AUTH),
        ("DELETE", "/v1/conversations", None, AUTH),
    ],
    "admin_conversations": [
        ("GET", f"{_AGENT_ADMIN}/conversations?limit=10", None, ADMIN),
        ("GET", f"{_AGENT_ADMIN}/conversations?user=alice", None, ADMIN),
        ("GET", f"{_AGENT_ADMIN}/conversations?bucket=xyz", None, ADMIN),
        ("GET", f"{_AGENT_ADMIN}/conversations", None, AUTH),
    ],
    "admin_show": [
        ("GET", f"{_AGENT_ADMIN}/conversations/c1?last=5", None, ADMIN),
        ("GET", f"{_AGENT_ADMIN}/conversations/never", None, ADMIN),
        ("GET", f"{_AGENT_ADMIN}/conversations/a%3Ab", None, ADMIN),
        ("GET", f"{_AGENT_ADMIN}/conversations/c1", None, {}),
    ],
    "admin_export": [
        ("GET", f"{_AGENT_ADMIN}/export", None, ADMIN),
        ("GET", f"{_AGENT_ADMIN}/export?conversation=c1", None, ADMIN),
        ("GET", f"{_AGENT_ADMIN}/export?conversation=never", None, ADMIN),
        ("GET", f"{_AGENT_ADMIN}/export", None, AUTH),
    ],
    "admin_stats": [
        ("GET", f"{_AGENT_ADMIN}/stats", None, ADMIN),
        ("GET", f"{_AGENT_ADMIN}/stats", None, {"Authorization": "Bearer dev-admin:"}),
    ],
    "admin_erase_conversation": [
        ("DELETE", f"{_AGENT_ADMIN}/conversations/c1", None, ADMIN),
        ("DELETE", f"{_AGENT_ADMIN}/conversations/c1", None, AUTH),
    ],
    "admin_erase_agent": [
        ("DELETE", "/v1/admin/namespaces/team-a/agents/support-agent/memory", None, ADMIN),
        ("DELETE", "/v1/admin/namespaces/team-a/agents/support-agent/memory", None, AUTH),
        ("DELETE", "/v1/admin/namespaces/Team_A/agents/support-agent/memory", None, ADMIN),
    ],
    "admin_erase_user": [
        ("DELETE", "/v1/admin/namespaces/team-a/agents/support-agent/users/alice/memory", None, ADMIN),
        ("DELETE", "/v1/admin/namespaces/team-a/agents/support-agent/users/alice/memory", None, {}),
    ],
    "admin_erase_user_everywhere": [
        ("DELETE", "/v1/admin/namespaces/team-a/users/alice/memory", None, ADMIN),
        ("DELETE", "/v1/admin/namespaces/team-a/users/alice/memory", None, AUTH),
    ],
    "admin_erase_registry": [
        ("DELETE", "/v1/admin/registries/support-team/memory", None, ADMIN),
        ("DELETE", "/v1/admin/registries/support-team/memory", None, AUTH),
        ("DELETE", "/v1/admin/registries/Bad_Name/memory", None, ADMIN),
    ],
    "erase_user": [
        ("DELETE", "/v1/users/me/conversations", None, {**AUTH, api.USER_CAPABILITY_HEADER: ALICE}),
        ("DELETE", "/v1/users/me/conversations", None, AUTH),
        ("DELETE", "/v1/users/me/conversations", None, {**AUTH, api.USER_CAPABILITY_HEADER: "forged"}),
    ],
}


@pytest.fixture
async def app(valkey_server: ValkeyProcess, tmp_path: Path) -> AsyncIterator[ProxyApp]:
    (tmp_path / "capability-key").write_bytes(CAPABILITY_KEY)
    settings = ProxySettings.from_env(
        {
            env.VALKEY_URL: valkey_server.url,
            env.AUTH_MODE: "dev",
            env.CAPABILITY_KEY_FILE: str(tmp_path / "capability-key"),
        }
    )
    instance = create_app(settings)
    yield instance
    await instance.aclose()


def _client(app: ProxyApp) -> AbstractAsyncContextManager[httpx.AsyncClient]:
    return served_client(app)


def _minted(headers: dict[str, str]) -> dict[str, str]:
    if headers.get(api.USER_CAPABILITY_HEADER) != ALICE:
        return headers
    fresh = mint_capability(CAPABILITY_KEY, "alice", Owner("team-a", "support-agent"), 600)
    return {**headers, api.USER_CAPABILITY_HEADER: fresh}


def _conforms(route: Route[Any], response: httpx.Response) -> None:
    assert response.status_code in route.all_statuses, (route.op, response.status_code, response.text)
    model: type[BaseModel] | None = route.response if response.status_code == 200 else wire.ErrorResponse
    if model is not None:
        model.model_validate_json(response.content, strict=False)
    if response.status_code == 200 and route.op == "openapi":
        assert orjson.loads(response.content) == document()


def test_every_operation_of_the_table_is_exercised() -> None:
    assert set(CALLS) == {route.op for route in ROUTES}


async def test_every_reply_of_every_route_matches_its_wire_model_and_a_documented_status(app: ProxyApp) -> None:
    by_op = {route.op: route for route in ROUTES}
    seen: dict[str, set[int]] = {}
    async with _client(app) as client:
        for op, calls in CALLS.items():
            for method, path, body, headers in calls:
                response = await client.request(method, path, json=body, headers=_minted(headers))
                _conforms(by_op[op], response)
                seen.setdefault(op, set()).add(response.status_code)
    # Every operation answers 200 to someone, but the agents' bulk erase, which answers nobody.
    assert [op for op, statuses in seen.items() if 200 not in statuses] == ["clear"]
    assert all(len(statuses) > 1 for op, statuses in seen.items() if CALLS[op][1:]), seen


def test_the_committed_openapi_document_is_current() -> None:
    assert COMMITTED.read_bytes() == document_bytes(), "run: python -m sessionmem_proxy.openapi --write"


def test_the_openapi_lists_only_statuses_the_server_answers() -> None:
    doc = document()
    for route in ROUTES:
        listed = {int(status) for status in doc["paths"][route.path][route.method.lower()]["responses"]}
        assert listed == set(route.all_statuses), route.op
        assert 422 not in listed
    assert b"422" not in COMMITTED.read_bytes()


async def test_refused_parameters_are_typed_400s_never_422(app: ProxyApp) -> None:
    async with _client(app) as client:
        for target in (
            "/v1/conversations/c/entries?limit=abc",
            "/v1/conversations/c/entries?summary=maybe",
            "/v1/conversations/c/search?q=",
            "/v1/conversations?limit=0",
            "/v1/conversations?limit=%C2%B9",  # a superscript one: a digit to str.isdigit, not an integer
        ):
            response = await client.get(target, headers=AUTH)
            assert response.status_code == 400, (target, response.text)
            assert response.json()["error"]["type"] == "invalid_request"


async def test_a_get_on_the_entries_path_without_an_id_never_writes(
    app: ProxyApp, valkey_server: ValkeyProcess
) -> None:
    """Issue #20 item 9: ``GET /v1/conversations/entries`` is the info of a conversation named
    "entries"; with a JSON body it still only reads."""
    async with _client(app) as client:
        response = await client.request("GET", "/v1/conversations/entries", json=EXCHANGE, headers=AUTH)
        posted = await client.post("/v1/conversations/entries", json=EXCHANGE, headers=AUTH)
    assert response.status_code == 200 and response.json()["exists"] is False
    assert posted.status_code == 405 and posted.headers["allow"] == "DELETE, GET, PUT"
    assert valkey_server.client().keys("*") == []


@pytest.mark.parametrize("bad", ["a%FF", "a%FE", "%C0%AF", "%ED%A0%80", "a%80b"])
async def test_invalid_utf8_in_an_id_is_a_typed_400(app: ProxyApp, bad: str) -> None:
    """Issue #20 item 10: bytes that are not UTF-8 are refused, never folded into U+FFFD."""
    async with _client(app) as client:
        for method, path in (
            ("GET", f"/v1/conversations/{bad}/entries"),
            ("POST", f"/v1/conversations/{bad}/entries"),
            ("GET", f"/v1/conversations/{bad}"),
            ("DELETE", f"/v1/conversations/{bad}"),
        ):
            body = EXCHANGE if method == "POST" else None
            response = await client.request(method, path, json=body, headers=AUTH)
            assert response.status_code == 400, (method, path, response.text)
            assert response.json()["error"]["type"] == "invalid_conversation_id"


async def test_the_replacement_character_is_refused_and_nfc_nfd_are_two(
    app: ProxyApp, valkey_server: ValkeyProcess
) -> None:
    """granian decodes ``a%FF`` to ``a`` and U+FFFD: U+FFFD itself is refused too, or the two would meet."""
    async with _client(app) as client:
        named = await client.post("/v1/conversations/a%EF%BF%BD/entries", json=EXCHANGE, headers=AUTH)
        undecodable = await client.get("/v1/conversations/a%FF/entries", headers=AUTH)
        nfc = await client.post("/v1/conversations/caf%C3%A9/entries", json=EXCHANGE, headers=AUTH)
        nfd = await client.get("/v1/conversations/cafe%CC%81/entries", headers=AUTH)
    assert named.status_code == 400 and undecodable.status_code == 400
    assert named.json()["error"]["type"] == "invalid_conversation_id"
    assert nfc.status_code == 200 and nfd.json()["entries"] == [], "NFC and NFD forms are two conversations"
    keys = sorted(k.decode() for k in valkey_server.conversation_keys())
    assert keys == ["mem:team-a/support-agent:caf\u00e9"]


def test_each_route_hands_its_handler_one_typed_parameter_set() -> None:
    """A route's parameters reach its handler as one object whose fields are the route's declared
    parameters, in order; a set whose fields and declarations disagree is refused when it is declared."""
    from dataclasses import fields

    from sessionmem_proxy import operations

    for route in ROUTES:
        names = [f.name for f in fields(route.params) if not f.kw_only][: len(route.declared_params)]
        assert names == [p.key for p in route.declared_params], route.op
    raw = operations.RawRequest({"conversationId": "c1"}, {"limit": "7"}, {"authorization": "Bearer x"})
    parsed = operations.parse(operations.ReadParams, raw)
    assert (parsed.conversation_id, parsed.limit, parsed.summary, parsed.authorization) == ("c1", 7, False, "Bearer x")
    with pytest.raises(TypeError):
        operations.declared(_Swapped)


@dataclass
class _Swapped:
    """Parameters whose fields are not in their declarations' order."""

    PARAMS: ClassVar[tuple[Param, ...]] = (CAP, TTL)
    ttl_seconds: int
    cap: int
