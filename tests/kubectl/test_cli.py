"""The plugin's parts that need no cluster: completion answers, the port-forward it would run, and how
it renders a transcript and a receipt."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sessionmem_client.kubectl import completion, proxy
from sessionmem_client.kubectl.agents import summarize
from sessionmem_client.kubectl.cli import render_receipt, render_transcript
from sessionmem_core import wire
from sessionmem_core.keys import Owner, conversation_of, per_user_key, session_key, session_prefix, usage_keys


def test_completion_offers_commands_flags_and_output_formats() -> None:
    assert completion.candidates(["s"]) == ["status", "show"]
    assert completion.candidates([""]) == ["status", "conversations", "show", "export", "erase"]
    assert "--last" in completion.candidates(["show", "--l"])
    assert "--yes" in completion.candidates(["erase", "agent", "--"])
    assert completion.candidates(["show", "-o", ""]) == ["table", "json", "yaml"]
    assert completion.candidates(["show", "--user", ""]) == []


def test_the_completion_script_answers_in_kubectls_format(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("kubectl_complete-sessionmem")
    # An agent name is looked up in the cluster: with a kubeconfig that points nowhere there is none,
    # and the answer is still well formed.
    missing = tmp_path / "absent.kubeconfig"
    done = subprocess.run(
        [str(script), "show", "--kubeconfig", str(missing), ""], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0 and done.stdout.splitlines() == [completion.NO_FILE_COMPLETION]
    done = subprocess.run([str(script), "conv"], capture_output=True, text=True, timeout=30, check=False)
    assert done.stdout.splitlines() == ["conversations", completion.NO_FILE_COMPLETION]


def test_the_port_forward_uses_the_callers_kubeconfig_and_reads_the_local_port() -> None:
    command = proxy.port_forward_command("kubectl", "/k/config", "prod", "sessionmem", "sm-proxy", 8000)
    assert command == [
        "kubectl", "--kubeconfig", "/k/config", "--context", "prod", "port-forward", "--address", "127.0.0.1",
        "-n", "sessionmem", "service/sm-proxy", ":8000",
    ]  # fmt: skip
    assert proxy.forwarded_port("Forwarding from 127.0.0.1:41234 -> 8000") == 41234
    assert proxy.forwarded_port("Forwarding from [::1]:41234 -> 8000") is None


def test_a_token_sent_in_the_clear_over_a_network_is_warned_about() -> None:
    assert proxy.plain_http_warning("http://127.0.0.1:8000") is None
    assert proxy.plain_http_warning("https://proxy.example:8443") is None
    warning = proxy.plain_http_warning("http://sessionmem-proxy.sessionmem.svc:8000")
    assert warning and "sessionmem-proxy.sessionmem.svc" in warning


def test_a_transcript_reads_oldest_first_with_author_and_time() -> None:
    at = 1_767_225_600_000
    transcript = wire.Transcript(
        namespace="team", agent="agent", conversationId="c", version=2, total=3, ttlSeconds=3700,
        entries=[wire.Entry(id="a", v=1, role=wire.Role.USER, content="hi\nthere", author="team/agent", ts=at),
                 wire.Entry(id="b", v=1, role=wire.Role.ASSISTANT, content="hello", author="team/agent", ts=at)],
    )  # fmt: skip
    text = render_transcript(transcript)
    assert "3 entries, version 2, expires in 1h01m; the newest 2 shown" in text
    assert "[2026-01-01 00:00:00Z] user (written by team/agent):\n    hi\n    there\n" in text
    assert text.index("hi") < text.index("hello")


def test_a_receipt_names_who_erased_what() -> None:
    receipt = wire.ErasureReceipt(namespace="n", agent="a", keys=["mem:n/a:c"], entries=2, erasedBy="alice")
    assert render_receipt(receipt) == "Erased by alice: n/a\n1 conversation key, 2 entries removed\n  mem:n/a:c\n"


def test_a_receipt_lists_the_data_keys_an_erasure_destroyed() -> None:
    sealed = wire.ErasureReceipt(
        namespace="n", agent="a", keys=["mem:n/a:c"], entries=2, erasedBy="alice", dataKeysDestroyed=["n/a"]
    )
    assert render_receipt(sealed).endswith("1 data key destroyed\n  n/a\n")
    plain = wire.ErasureReceipt(namespace="n", agent="a", keys=[], entries=0, erasedBy="alice")
    assert "data key" not in render_receipt(plain)


def test_a_receipt_counts_in_words_that_agree_with_the_number() -> None:
    none = wire.ErasureReceipt(namespace="n", agent="a", keys=[], entries=0, erasedBy="alice")
    assert "0 conversation keys, 0 entries removed" in render_receipt(none)
    one = wire.ErasureReceipt(namespace="n", agent="a", keys=["mem:n/a:c"], entries=1, erasedBy="alice")
    assert "1 conversation key, 1 entry removed" in render_receipt(one)
    two = wire.ErasureReceipt(namespace="n", agent="a", keys=["mem:n/a:c", "mem:n/a:d"], entries=3, erasedBy="a")
    assert "2 conversation keys, 3 entries removed" in render_receipt(two)


def test_an_agents_keys_parse_back_into_bucket_and_conversation() -> None:
    owner = Owner("team", "agent")
    prefix = session_prefix(owner)
    bucket = "0123456789abcdef0123456789abcdef"
    assert conversation_of(prefix, session_key(owner, "c-1")) == (None, "c-1")
    assert conversation_of(prefix, per_user_key(owner, bucket, "u")) == (bucket, "u")
    # Not this agent's conversations: another agent, a shared key, the usage accounting, a bad layout.
    assert conversation_of(prefix, session_key(Owner("team", "agent-2"), "c")) is None
    assert conversation_of(prefix, "mem:shared:reg:c") is None
    assert conversation_of(prefix, usage_keys("team/agent")[0]) is None
    assert conversation_of(prefix, prefix + "u:nothex:c") is None


def test_status_shows_the_scope_in_effect_not_the_one_requested() -> None:
    memory_ready = {"type": "MemoryReady", "status": "False", "reason": "NotARegistryMember", "message": "m"}
    body = {
        "metadata": {"name": "a", "namespace": "n"},
        "spec": {"sessionMemory": {"scope": "shared"}},
        "status": {"scope": "session", "conditions": [memory_ready]},
    }
    shown = summarize(body)
    assert (shown.scope, shown.requested_scope, shown.reason) == ("session", "shared", "NotARegistryMember")
    not_yet = summarize({**body, "status": {}})
    assert (not_yet.scope, not_yet.requested_scope) == ("-", "shared")
    off = summarize({**body, "spec": {}})
    assert (off.enabled, off.scope) == (False, "-")
