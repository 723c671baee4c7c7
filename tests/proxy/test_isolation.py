"""Isolation between users and between agents through the real proxy on a real valkey-server, and a
property-based check that no request of any shape creates a key outside the layouts."""

from __future__ import annotations

import string
from pathlib import Path
from urllib.parse import quote

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionmem_core import env
from sessionmem_core.capability import mint_capability, new_key
from sessionmem_core.devauth import dev_token
from sessionmem_core.keys import Owner, matches_layout
from sessionmem_launcher.server import Launcher
from tests.conftest import launcher_settings
from tests.support.processes import ServiceProcess
from tests.support.serving import serve_in_background
from tests.support.valkey import ValkeyProcess

AGENT_A = Owner("team-a", "support-agent")
AGENT_B = Owner("team-b", "support-agent")
AGENT_C = Owner("team-a", "billing-agent")


def auth(owner: Owner) -> dict[str, str]:
    return {"Authorization": f"Bearer {dev_token(owner.namespace, owner.agent)}"}


def test_agents_never_see_each_others_conversations(per_user_proxy: ServiceProcess) -> None:
    with httpx.Client(base_url=per_user_proxy.base_url) as client:
        body = {"entries": [{"role": "user", "content": "secret of A"}]}
        assert client.post("/v1/conversations/same-id/entries", json=body, headers=auth(AGENT_A)).status_code == 200
        for other in (AGENT_B, AGENT_C):
            assert client.get("/v1/conversations/same-id/entries", headers=auth(other)).json()["entries"] == []
            assert client.get("/v1/conversations/same-id/search?q=secret", headers=auth(other)).json()["matches"] == []
            assert client.delete("/v1/conversations/same-id", headers=auth(other)).json()["entries"] == 0
        history = client.get("/v1/conversations/same-id/entries", headers=auth(AGENT_A)).json()
    assert [e["content"] for e in history["entries"]] == ["secret of A"]


def test_users_on_the_same_conversation_see_disjoint_histories(
    per_user_proxy: ServiceProcess, capability_key: bytes, valkey_server: ValkeyProcess
) -> None:
    alice = {"X-Sessionmem-User-Capability": mint_capability(capability_key, "alice", AGENT_A, 60), **auth(AGENT_A)}
    bob = {"X-Sessionmem-User-Capability": mint_capability(capability_key, "bob", AGENT_A, 60), **auth(AGENT_A)}
    forged = {"X-Sessionmem-User-Capability": mint_capability(new_key(), "alice", AGENT_A, 60), **auth(AGENT_A)}
    expired = {
        "X-Sessionmem-User-Capability": mint_capability(capability_key, "alice", AGENT_A, 60, now=1000),
        **auth(AGENT_A),
    }
    foreign = {"X-Sessionmem-User-Capability": mint_capability(capability_key, "alice", AGENT_C, 60), **auth(AGENT_A)}
    with httpx.Client(base_url=per_user_proxy.base_url) as client:
        for who, headers in (("alice", alice), ("bob", bob)):
            body = {"entries": [{"role": "user", "content": f"I am {who}"}]}
            assert client.post("/v1/conversations/c1/entries", json=body, headers=headers).status_code == 200
        seen = {
            who: [e["content"] for e in client.get("/v1/conversations/c1/entries", headers=h).json()["entries"]]
            for who, h in (("alice", alice), ("bob", bob))
        }
        plain = client.get("/v1/conversations/c1/entries", headers=auth(AGENT_A)).json()["entries"]
        refused = {
            name: client.get("/v1/conversations/c1/entries", headers=h).status_code
            for name, h in (("forged", forged), ("expired", expired), ("foreign", foreign))
        }
    assert seen == {"alice": ["I am alice"], "bob": ["I am bob"]}
    assert plain == []
    assert refused == {"forged": 401, "expired": 401, "foreign": 403}
    keys = [k.decode() for k in valkey_server.conversation_keys()]
    assert len(keys) == 2 and all(":u:" in k for k in keys)
    assert not any("alice" in k or "bob" in k for k in keys), "user ids never become part of a key"


def test_the_proxy_refuses_long_lived_and_non_ascii_capabilities(
    per_user_proxy: ServiceProcess, capability_key: bytes
) -> None:
    """A capability minted for an hour is refused by the proxy's own maximum; a non-ASCII header value is a
    typed 400, never a 500 nor a request served as if the header were absent."""
    hour = mint_capability(capability_key, "alice", AGENT_A, 3600)
    fifteen_minutes = mint_capability(capability_key, "alice", AGENT_A, 900)
    with httpx.Client(base_url=per_user_proxy.base_url) as client:

        def read(capability: bytes) -> httpx.Response:
            headers = {
                b"X-Sessionmem-User-Capability": capability,
                **{k.encode(): v.encode() for k, v in auth(AGENT_A).items()},
            }
            return client.get("/v1/conversations/c1/entries", headers=headers)

        assert read(fifteen_minutes.encode()).status_code == 200
        too_long = read(hour.encode())
        assert too_long.status_code == 401 and "longer than this proxy allows" in too_long.json()["error"]["message"]
        non_ascii = read(fifteen_minutes.encode() + "é".encode("latin-1"))
        assert non_ascii.status_code == 400 and non_ascii.json()["error"]["type"] == "invalid_request"
        assert "x-sessionmem-user-capability" in non_ascii.json()["error"]["message"]


_printable = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=140)
_ids = st.one_of(_printable, st.text(alphabet=string.ascii_letters + string.digits + "-_.~", min_size=1, max_size=130))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    conversation_id=_ids,
    user=st.one_of(st.none(), _printable.filter(bool)),
    content=_printable,
    role=st.sampled_from(["user", "assistant", "system", "tool", ""]),
    scope=st.sampled_from(["session", "shared", "other"]),
)
def test_no_request_creates_a_key_outside_the_layouts(
    per_user_proxy: ServiceProcess,
    valkey_server: ValkeyProcess,
    capability_key: bytes,
    conversation_id: str,
    user: str | None,
    content: str,
    role: str,
    scope: str,
) -> None:
    headers = auth(AGENT_A)
    if user is not None and len(user) <= 256:
        headers["X-Sessionmem-User-Capability"] = mint_capability(capability_key, user, AGENT_A, 60)
    member = {"Authorization": f"Bearer {dev_token('team-a', 'support-agent', registry='helpdesk')}"}
    # Dots are encoded too: a client would otherwise rewrite '.' and '..' as path segments.
    path = f"/v1/conversations/{quote(conversation_id, safe='').replace('.', '%2E')}"
    with httpx.Client(base_url=per_user_proxy.base_url) as client:
        for who in (headers, member):
            response = client.post(
                f"{path}/entries?scope={scope}", json={"entries": [{"role": role, "content": content}]}, headers=who
            )
            assert response.status_code in (200, 400), response.text
            assert response.status_code < 500
    for key in valkey_server.client().scan_iter("*"):
        assert matches_layout(key.decode()), key


async def test_through_the_launcher_user_headers_set_by_the_agent_change_nothing(
    per_user_proxy: ServiceProcess, capability_key: bytes, dev_token_file: Path, valkey_server: ValkeyProcess
) -> None:
    settings = launcher_settings(per_user_proxy.base_url, dev_token_file, **{env.PER_USER: "true"})
    launcher = Launcher(settings, serve_host="127.0.0.1", serve=serve_in_background)
    await launcher.start()
    alice = mint_capability(capability_key, "alice", AGENT_A, 60)
    path = "/v1/conversations/c1/entries"
    body = {"entries": [{"role": "user", "content": "hello"}]}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{launcher.memory_port}") as client:
            missing = await client.post(path, json=body, headers={"X-User-Id": "mallory"})
            raw_capability = await client.post(path, json=body, headers={"X-Sessionmem-User-Capability": alice})
            # Alice's turn in flight, as the managed loop binds it for the request it relays to the agent.
            with launcher.turns.bound(alice) as turn:
                as_alice = await client.post(
                    path, json=body, headers={"X-Sessionmem-Turn": turn, "X-User-Id": "mallory"}
                )
                alice_view = await client.get(path, headers={"X-Sessionmem-Turn": turn})
            after_the_turn = await client.get(path, headers={"X-Sessionmem-Turn": turn})
    finally:
        await launcher.stop()
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "user_capability_required"
    assert raw_capability.status_code == 401 and raw_capability.json()["error"]["type"] == "capability_not_accepted"
    assert as_alice.status_code == 200
    assert [e["content"] for e in alice_view.json()["entries"]] == ["hello"]
    assert after_the_turn.status_code == 401 and after_the_turn.json()["error"]["type"] == "turn_not_live"
    keys = [k.decode() for k in valkey_server.conversation_keys()]
    assert len(keys) == 1 and ":u:" in keys[0] and "mallory" not in keys[0]
