"""The path of one append, from the launcher's memory route to Valkey and back, as docs/architecture.md
lists it: the product files whose code runs for it, traced while it runs (the launcher and the proxy in
this process, against a real valkey-server). The list in the doc and the code must agree: a file the
append starts to cross, or stops crossing, fails this test until the doc says so."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import orjson

from sessionmem_core import env
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


async def _append_and_trace(valkey: ValkeyProcess, token: Path) -> set[str]:
    proxy = await serve_in_background(
        create_app(ProxySettings.from_env({env.VALKEY_URL: valkey.url, env.AUTH_MODE: "dev"}))
    )
    token.write_text(dev_token("team-a", "support-agent"))
    launcher = Launcher(
        launcher_settings(f"http://127.0.0.1:{proxy.port}", token), serve_host="127.0.0.1", serve=serve_in_background
    )
    await launcher.start()
    client = HttpClient(f"http://127.0.0.1:{launcher.memory_port}", timeout=10)
    ran: set[str] = set()

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call":
            ran.add(frame.f_code.co_filename)

    async def append(message_id: str) -> int:
        body = orjson.dumps({"entries": [{"role": "user", "content": "hi", "id": message_id}]})
        answer = await client.request(
            "POST", "/v1/conversations/path-1/entries", [(b"content-type", b"application/json")], body
        )
        return answer.status

    try:
        assert await append("m1") == 200  # the first call connects, loads and caches: not what every append does
        sys.setprofile(profile)
        threading.setprofile(profile)
        try:
            status = await append("m2")
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
        assert status == 200
    finally:
        await client.aclose()
        await launcher.stop()
        await proxy.stop()
    return {str(Path(name).resolve().relative_to(REPO)) for name in ran if name.startswith(PRODUCT)}


async def test_an_append_crosses_the_files_docs_architecture_lists(
    valkey_server: ValkeyProcess, tmp_path: Path
) -> None:
    crossed = await _append_and_trace(valkey_server, tmp_path / "token")
    listed = listed_files()
    assert len(listed) == len(set(listed)), "a file listed twice"
    assert sorted(crossed) == sorted(listed), {
        "crossed, not listed": sorted(set(crossed) - set(listed)),
        "listed, not crossed": sorted(set(listed) - set(crossed)),
    }
