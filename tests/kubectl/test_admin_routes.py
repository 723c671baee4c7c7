"""The proxy's admin read routes on the real proxy process and a real valkey-server (dev identity mode: the
RBAC side is tests/kubectl/test_plugin.py): an export is answered page by page, whole and in order,
listings page, and the stats agree with what Valkey holds."""

from __future__ import annotations

import json

import httpx

from sessionmem_core import api
from sessionmem_core.devauth import dev_token
from tests.support.processes import ServiceProcess
from tests.support.valkey import ValkeyProcess

AGENT_PATH = "/v1/admin/namespaces/team-a/agents/support-agent"
ADMIN = {"Authorization": "Bearer dev-admin:alice"}
AGENT = {"Authorization": f"Bearer {dev_token('team-a', 'support-agent')}"}
LONG = 300
# Large enough that one export page holds far fewer than LONG entries.
BODY = "x" * 20_000


def _fill(proxy: ServiceProcess) -> None:
    with httpx.Client(base_url=proxy.base_url, headers=AGENT, timeout=30) as client:
        for start in range(0, LONG, 50):
            batch = [{"role": "user", "content": f"{i}:{BODY}"} for i in range(start, start + 50)]
            for chunk in (batch[:25], batch[25:]):
                response = client.post(api.entries_path("long"), json={"entries": chunk}, params={"cap": "1000"})
                assert response.status_code == 200, response.text
        hello = {"entries": [{"role": "user", "content": "hi"}]}
        for conversation in ("a", "b", "c"):
            response = client.post(api.entries_path(conversation), json=hello)
            assert response.status_code == 200, response.text


def test_an_export_is_paged_and_its_pages_are_whole_and_in_order(proxy_process: ServiceProcess) -> None:
    _fill(proxy_process)
    pages: list[bytes] = []
    offset: str | None = "0"
    with httpx.Client(base_url=proxy_process.base_url, headers=ADMIN, timeout=60) as client:
        while offset is not None:
            response = client.get(f"{AGENT_PATH}/export", params={"conversation": "long", "offset": offset})
            assert response.status_code == 200 and response.headers["content-type"] == api.NDJSON
            pages.append(response.content)
            offset = response.headers.get(api.NEXT_OFFSET_HEADER)
    lines = [json.loads(line) for page in pages for line in page.splitlines()]
    assert [line["content"].split(":", 1)[0] for line in lines] == [str(i) for i in range(LONG)]
    assert all(line["conversationId"] == "long" for line in lines)
    assert all(line["author"] == "team-a/support-agent" and line["bucket"] is None for line in lines)
    # Pages of about a megabyte: the proxy never held the whole conversation for one answer.
    assert len(pages) >= (LONG * len(BODY)) // (1024 * 1024)
    assert max(map(len, pages)) < 1024 * 1024 + 2 * len(BODY)


def test_listing_pages_follow_the_cursor_and_stats_match_valkey(
    proxy_process: ServiceProcess, valkey_server: ValkeyProcess
) -> None:
    _fill(proxy_process)
    seen: list[str] = []
    cursor = "0"
    with httpx.Client(base_url=proxy_process.base_url, headers=ADMIN, timeout=30) as client:
        while True:
            page = client.get(f"{AGENT_PATH}/conversations", params={"limit": "1", "cursor": cursor}).json()
            seen += [c["conversationId"] for c in page["conversations"]]
            if page["nextCursor"] is None:
                break
            cursor = page["nextCursor"]
        stats = client.get(f"{AGENT_PATH}/stats").json()
        missing = client.get(f"{AGENT_PATH}/export", params={"conversation": "nope"})
    assert sorted(set(seen)) == ["a", "b", "c", "long"]
    store = valkey_server.client()
    keys = [key.decode() for key in store.keys("mem:team-a/support-agent:*")]
    stored = sum(len(entry) for key in keys for entry in store.lrange(key, 0, -1))
    assert (stats["conversations"], stats["bytes"]) == (4, stored)
    assert stats["examined"] == 4 and stats["complete"] and stats["oldestWriteTs"] <= stats["newestWriteTs"]
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"
