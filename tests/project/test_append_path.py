"""The path of one append, from the launcher's memory route to Valkey and back, as docs/architecture.md
lists it: the product files whose code runs for it, traced while it runs (the launcher and the proxy in
this process, against a real valkey-server). The list in the doc and the code must agree: a file the
append starts to cross, or stops crossing, fails this test until the doc says so.

The same trace counts how often each process parses what a request carries: the conversation id, the
path's route and the query, once per request it receives, on the memory route and in a managed-loop turn."""

from __future__ import annotations

import re
import sys
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import orjson

from sessionmem_core import api, env
from sessionmem_core.devauth import dev_token
from sessionmem_core.env import ProxySettings
from sessionmem_infra.http_client import HttpClient
from sessionmem_launcher.server import Launcher
from sessionmem_proxy.app import create_app
from tests.conftest import launcher_settings
from tests.support.serving import serve_in_background
from tests.support.valkey import ValkeyProcess

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
PRODUCT = tuple(str(REPO / folder) + "/" for folder in ("core", "infra", "proxy", "launcher"))
_LISTED = re.compile(r"^- `([a-z_/]+\.py)`", re.MULTILINE)


def listed_files() -> list[str]:
    """The files docs/architecture.md lists for an append (its "An append, in files" list)."""
    text = DOC.read_text()
    section = text[text.index("### An append, in files") :]
    section = section[: section.index("\n## ")] if "\n## " in section else section
    return _LISTED.findall(section)


# What a request carries and each process parses: (module, function) as the trace counts them.
PARSERS = {
    ("keys.py", "parse_conversation_id"),
    ("api.py", "memory_route"),
    ("api.py", "parse_query"),
    ("routes.py", "match"),
}


class Trace:
    """The product files whose code ran, and the parsers' calls by the component that made them."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.parsed: Counter[tuple[str, str]] = Counter()

    def __call__(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        self.files.add(code.co_filename)
        if (Path(code.co_filename).name, code.co_name) in PARSERS and frame.f_back is not None:
            caller = Path(frame.f_back.f_code.co_filename).resolve()
            component = caller.relative_to(REPO).parts[0] if caller.is_relative_to(REPO) else "?"
            self.parsed[(component, code.co_name)] += 1

    def product_files(self) -> set[str]:
        return {str(Path(name).resolve().relative_to(REPO)) for name in self.files if name.startswith(PRODUCT)}


async def _traced(
    valkey: ValkeyProcess, token: Path, agent_port: int, call: Callable[[int, int], Awaitable[int]]
) -> Trace:
    """Run ``call`` twice against a launcher and a proxy served in this process; trace the second run (the
    first connects, loads and caches: not what every call does)."""
    settings = ProxySettings.from_env({env.VALKEY_URL: valkey.url, env.AUTH_MODE: "dev"})
    proxy = await serve_in_background(create_app(settings))
    token.write_text(dev_token("team-a", "support-agent"))
    launcher = Launcher(
        launcher_settings(f"http://127.0.0.1:{proxy.port}", token, **{env.AGENT_PORT: str(agent_port)}),
        serve_host="127.0.0.1",
        serve=serve_in_background,
    )
    await launcher.start()
    trace = Trace()
    ports = launcher.memory_port, launcher.serve_port
    try:
        assert await call(*ports) == 200
        sys.setprofile(trace)
        threading.setprofile(trace)
        try:
            status = await call(*ports)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
        assert status == 200
    finally:
        await launcher.stop()
        await proxy.stop()
    return trace


_JSON = [(b"content-type", b"application/json")]


async def _append(memory_port: int, _serve_port: int) -> int:
    """An append on the memory route, as an agent sends it."""
    client = HttpClient(f"http://127.0.0.1:{memory_port}", timeout=10)
    try:
        body = orjson.dumps({"entries": [{"role": "user", "content": "hi", "id": f"m-{id(client)}"}]})
        return (await client.request("POST", "/v1/conversations/path-1/entries", _JSON, body)).status
    finally:
        await client.aclose()


async def _turn(_memory_port: int, serve_port: int) -> int:
    """A managed-loop turn: replay, the agent, the exchange appended."""
    client = HttpClient(f"http://127.0.0.1:{serve_port}", timeout=10)
    try:
        headers = [*_JSON, (api.CONVERSATION_ID_HEADER.encode(), b"turn-1")]
        return (await client.request("POST", "/invoke", headers, orjson.dumps({"input": "hello"}))).status
    finally:
        await client.aclose()


async def test_an_append_crosses_the_files_docs_architecture_lists(
    valkey_server: ValkeyProcess, tmp_path: Path, demo_agent: int
) -> None:
    crossed = (await _traced(valkey_server, tmp_path / "token", demo_agent, _append)).product_files()
    listed = listed_files()
    assert len(listed) == len(set(listed)), "a file listed twice"
    assert sorted(crossed) == sorted(listed), {
        "crossed, not listed": sorted(set(crossed) - set(listed)),
        "listed, not crossed": sorted(set(listed) - set(crossed)),
    }


async def test_each_process_parses_what_a_request_carries_once(
    valkey_server: ValkeyProcess, tmp_path: Path, demo_agent: int
) -> None:
    """On the memory route the launcher parses the id, the route and the query once, and so does the proxy
    for the one request it gets; in a managed-loop turn the launcher parses the id once for the turn's
    two memory calls, and the proxy once for each."""
    appended = await _traced(valkey_server, tmp_path / "token", demo_agent, _append)
    assert appended.parsed == {
        ("launcher", "parse_conversation_id"): 1,
        ("launcher", "memory_route"): 1,
        ("launcher", "parse_query"): 1,
        ("proxy", "parse_conversation_id"): 1,
        ("proxy", "match"): 1,
        ("proxy", "parse_query"): 1,
    }
    turned = await _traced(valkey_server, tmp_path / "token", demo_agent, _turn)
    assert turned.parsed == {
        ("launcher", "parse_conversation_id"): 1,
        ("proxy", "parse_conversation_id"): 2,
        ("proxy", "match"): 2,
        ("proxy", "parse_query"): 2,
    }
