"""The shared rules themselves: ids, key layouts, env parsing."""

from __future__ import annotations

import os

import pytest

from sessionmem_core import env
from sessionmem_core.env import ConfigError, LauncherSettings, ProxySettings
from sessionmem_core.errors import InvalidConversationId, InvalidRequest
from sessionmem_core.keys import (
    Owner,
    matches_layout,
    new_conversation_id,
    new_message_id,
    per_user_key,
    session_key,
    shared_key,
    validate_conversation_id,
    validate_message_id,
)

BAD = [
    "",
    "x" * 129,
    "a/b",
    "a:b",
    "a b",
    "a\tb",
    "a\nb",
    "a\x01b",
    "a\x7fb",
    "a\u2028b",
    "a\x85b",
    "a\ufffd",
    ".",
    "..",
    'a"b',
    "a\\b",
]


@pytest.mark.parametrize("bad", BAD)
def test_bad_ids_are_rejected_with_a_typed_error(bad: str) -> None:
    with pytest.raises(InvalidConversationId):
        validate_conversation_id(bad)


@pytest.mark.parametrize("good", ["a", "x" * 128, "chat-1_2.3~x", "...", "日本語", "user@example.com"])
def test_good_ids_pass(good: str) -> None:
    assert validate_conversation_id(good) == good


def test_minted_ids_pass_the_rule() -> None:
    assert all(validate_conversation_id(new_conversation_id()) for _ in range(100))


def test_the_three_layouts_are_distinct_and_recognised() -> None:
    owner = Owner("team-a", "agent")
    keys = {session_key(owner, "c1"), shared_key("helpdesk", "c1"), per_user_key(owner, "0" * 32, "c1")}
    assert keys == {"mem:team-a/agent:c1", "mem:shared:helpdesk:c1", f"mem:team-a/agent:u:{'0' * 32}:c1"}
    assert all(matches_layout(k) for k in keys)
    for stray in ("mem:team-a/agent", "mem:team-a/agent:a:b", "other:x", "mem:shared:c1", "mem:Team/agent:c1"):
        assert not matches_layout(stray), stray


def test_owner_names_must_be_kubernetes_labels() -> None:
    for namespace, agent in (("Team", "a"), ("a", "b/c"), ("a" * 64, "b"), ("a", "")):
        with pytest.raises(InvalidRequest):
            Owner(namespace, agent)


def test_launcher_settings_defaults_and_bad_values() -> None:
    settings = LauncherSettings.from_env({})
    assert (settings.replay_messages, settings.cap, settings.ttl_seconds) == (40, 500, 86400)
    assert (settings.launcher_port, settings.serve_port, settings.agent_port) == (2998, 8080, 8081)
    for name, value in ((env.SCOPE, "team"), (env.CAP, "0"), (env.REPLAY_MESSAGES, "x"), (env.PER_USER, "maybe")):
        with pytest.raises(ConfigError, match=name):
            LauncherSettings.from_env({name: value})


def test_proxy_defaults_to_tokenreview_not_dev_identity() -> None:
    assert ProxySettings.from_env({}).auth_mode == "tokenreview"
    with pytest.raises(ConfigError):
        ProxySettings.from_env({env.AUTH_MODE: "none"})


def test_minted_message_ids_are_valid_distinct_and_not_shared_with_a_forked_worker() -> None:
    """Ids are drawn a batch at a time: a worker forked after its parent drew a batch must not mint the
    ids left in the parent's batch (two workers would then store the same id and drop entries as retries)."""
    minted = [new_message_id() for _ in range(2000)]
    assert len(set(minted)) == len(minted)
    for message_id in minted:
        assert validate_message_id(message_id) == message_id and len(message_id) == 16
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, reported to the parent
        os.write(write_end, ",".join(new_message_id() for _ in range(50)).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = set(os.read(read_end, 65536).decode().split(","))
    parent = {new_message_id() for _ in range(50)}
    assert len(child) == 50 and not child & parent
