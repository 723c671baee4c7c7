"""The launcher's OpenAPI document: the committed file is what its route declarations generate, it is what
the memory endpoint serves, and it advertises only what the launcher really takes and answers."""

from __future__ import annotations

import httpx
import orjson

from sessionmem_core import api
from sessionmem_launcher import openapi
from sessionmem_launcher.forward import POD_PARAMS
from sessionmem_launcher.server import Launcher
from sessionmem_launcher.serving import OPENAPI_FILE


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
    # Only statuses the launcher answers: never FastAPI's 422, never an undocumented catch-all.
    statuses = {status for op in operations for status in op["responses"]}
    assert statuses <= {"200", "400", "401", "403", "404", "408", "409", "412", "413", "414", "431", "503"}, statuses


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
