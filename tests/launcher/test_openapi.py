"""The launcher's OpenAPI document: the committed file is what its route declarations generate, it is what
the memory endpoint serves, and it advertises only what the launcher really takes and answers."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson

from sessionmem_core import api, env
from sessionmem_launcher import openapi
from sessionmem_launcher.forward import POD_PARAMS
from sessionmem_launcher.server import Launcher
from sessionmem_launcher.serving import OPENAPI_FILE
from tests.conftest import launcher_settings
from tests.support.processes import dev_proxy
from tests.support.serving import serve_in_background
from tests.support.valkey import ValkeyProcess


def test_the_committed_document_is_current() -> None:
    assert OPENAPI_FILE.read_bytes() == openapi.render(), "run: python -m sessionmem_launcher.openapi"
    assert openapi.main(["--check"]) == 0


def test_every_declared_route_is_the_operation_the_router_gives() -> None:
    for route in openapi.ROUTES:
        path = route.path.replace("{conversationId}", "c1")
        op, conversation_id = api.memory_route(route.method, path)
        assert op == route.op, route
        assert conversation_id == ("c1" if "{conversationId}" in route.path else None), route


def test_no_parameter_the_launcher_sets_itself_is_advertised() -> None:
    doc = openapi.build()
    operations = [op for item in doc["paths"].values() for op in item.values()]
    names = {p["name"].lower() for op in operations for p in op.get("parameters", [])}
    assert api.TTL_PARAM.lower() in {p.lower() for p in POD_PARAMS}
    assert names.isdisjoint({p.lower() for p in POD_PARAMS} | {"authorization"}), names
    # Only statuses the launcher answers (its own, and the proxy's it relays: 304 to a conditional read, 429
    # over a rate, 507 over the storage quota): never FastAPI's 422, never an undocumented catch-all.
    statuses = {status for op in operations for status in op["responses"]}
    answered = {"200", "304", "400", "401", "403", "404", "408", "409", "412", "413", "414", "429", "431", "503", "507"}
    assert statuses <= answered, statuses


async def test_an_ignored_ttl_is_neither_advertised_nor_applied(launcher: Launcher) -> None:
    # ttlSeconds is the pod's (SESSIONMEM_TTL_SECONDS): what an agent sends for it is dropped, whatever it is.
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.memory_port}") as client:
        served = await client.get("/openapi.json")
        for ttl in ("0", "abc"):
            path = f"/v1/conversations/ttl-{ttl}"
            await client.post(f"{path}/entries?ttlSeconds={ttl}", json={"entries": [{"role": "user", "content": "x"}]})
            info = (await client.get(path)).json()
            assert info["exists"] is True and info["ttlSeconds"] > 3600, info
    assert served.status_code == 200 and orjson.loads(served.content) == openapi.build()
    assert "ttlSeconds" not in {
        p["name"] for p in served.json()["paths"]["/v1/conversations/{conversationId}/entries"]["post"]["parameters"]
    }


async def test_the_proxys_quota_answers_it_documents_reach_the_agent(
    valkey_server: ValkeyProcess, dev_token_file: Path, demo_agent: int
) -> None:
    """The launcher documents 507 and 429 because it relays them: an agent over its storage quota gets the
    proxy's typed 507, one over its request rate the proxy's 429 with Retry-After."""
    proxy = dev_proxy(
        valkey_server.url, **{env.QUOTA_BYTES: "2048", env.QUOTA_REQUESTS_PER_SECOND: "1", env.QUOTA_BURST: "4"}
    )
    proxy.start()
    launcher = Launcher(
        launcher_settings(proxy.base_url, dev_token_file, **{env.AGENT_PORT: str(demo_agent)}),
        serve_host="127.0.0.1",
        serve=serve_in_background,
    )
    await launcher.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.memory_port}") as client:
            big = {"entries": [{"role": "user", "content": "x" * 4096}]}
            await client.post("/v1/conversations/quota-1/entries", json=big)  # stored: the quota was not full
            full = await client.post("/v1/conversations/quota-1/entries", json=big)
            answers = [await client.get("/v1/conversations/quota-1/entries") for _ in range(8)]
    finally:
        await launcher.stop()
        proxy.stop()
    documented = openapi.build()["paths"]["/v1/conversations/{conversationId}/entries"]
    assert full.status_code == 507 and full.json()["error"]["type"] == "quota_exceeded", full.text
    assert "507" in documented["post"]["responses"]
    limited = [answer for answer in answers if answer.status_code == 429]
    assert limited and limited[0].json()["error"]["type"] == "rate_limited", [a.status_code for a in answers]
    assert "retry-after" in limited[0].headers and "429" in documented["get"]["responses"]
