"""``kubectl sessionmem`` against the real kube-apiserver and the real proxy on a real valkey-server, as
people RBAC allows or refuses: what it shows is what the agent stored, and an erase receipt names exactly
what left Valkey."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.kubectl.conftest import AGENT, END_USER, TURNS, USER_TURNS, MemoryWorld

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.valkey]

ALICE, BOB, CAROL = "alice-admin", "bob-reader", "carol-viewer"
STORED = len(TURNS) + len(USER_TURNS)


def test_status_shows_the_agents_memory_wiring_and_usage_against_its_quota(world: MemoryWorld) -> None:
    done = world.kubectl(BOB, "status", "-o", "json")
    assert done.code == 0, done.err
    (row,) = json.loads(done.out)
    assert (row["agent"], row["scope"], row["perUser"]) == (AGENT, "session", False)
    assert (row["memoryReady"], row["reason"]) == ("True", "Wired")
    stats = row["stats"]
    assert stats["conversations"] == STORED and stats["examined"] == STORED and stats["complete"]
    stored_bytes = sum(len(e) for k in world.stored_keys() for e in world.valkey.client().lrange(k, 0, -1))
    assert stats["bytes"] == stored_bytes
    assert stats["quotaConversations"] > STORED and stats["quotaBytes"] > stored_bytes
    assert stats["oldestWriteTs"] <= stats["newestWriteTs"]
    table = world.kubectl(BOB, "status")
    assert table.code == 0 and AGENT in table.out and f"{STORED}/{stats['quotaConversations']}" in table.out


def test_status_of_every_namespace_passes_on_the_api_servers_refusal(world: MemoryWorld) -> None:
    done = world.kubectl(BOB, "status", "-A")
    assert done.code == 1
    assert done.err.startswith("Forbidden: agentdeployments.agents.ctxmesh.ai is forbidden: User")
    assert "cluster scope" in done.err


def test_conversations_lists_every_conversation_with_its_bucket(world: MemoryWorld) -> None:
    done = world.kubectl(BOB, "conversations", AGENT, "-o", "yaml")
    assert done.code == 0, done.err
    listed = {c["conversationId"]: c for c in yaml.safe_load(done.out)}
    assert set(listed) == {*TURNS, *USER_TURNS}
    assert all(listed[c]["bucket"] is None and listed[c]["entries"] == 2 for c in TURNS)
    assert listed["u1"]["bucket"] is not None
    mine = world.kubectl(BOB, "conversations", AGENT, "--user", END_USER, "-o", "json")
    assert [c["conversationId"] for c in json.loads(mine.out)] == ["u1"]


def test_show_is_a_readable_transcript_with_authors_times_and_contents_in_order(world: MemoryWorld) -> None:
    done = world.kubectl(BOB, "show", AGENT, "c1")
    assert done.code == 0, done.err
    author = f"{world.namespace}/{AGENT}"
    positions = []
    for role, content in TURNS["c1"]:
        positions.append(done.out.index(content))
        line = done.out[: positions[-1]].rstrip().splitlines()[-1]
        assert line.endswith(f"{role} (written by {author}):") and line.startswith("[20")
    assert positions == sorted(positions)
    last = world.kubectl(BOB, "show", AGENT, "c1", "--last", "1", "-o", "json")
    transcript = json.loads(last.out)
    assert transcript["total"] == 2 and [e["content"] for e in transcript["entries"]] == [TURNS["c1"][1][1]]
    bucketed = world.kubectl(BOB, "show", AGENT, "u1", "--user", END_USER, "-o", "yaml")
    assert [e["content"] for e in yaml.safe_load(bucketed.out)["entries"]] == [c for _, c in USER_TURNS["u1"]]


def test_export_writes_every_stored_entry_as_json_lines(world: MemoryWorld) -> None:
    """The console script kubectl runs, as a process, with its stdout redirected to a file."""
    script = Path(sys.executable).with_name("kubectl-sessionmem")
    target = world.cluster.tmp_dir / f"{world.namespace}-export.jsonl"
    with target.open("wb") as out:
        done = subprocess.run(
            [str(script), "export", AGENT, "-n", world.namespace, "--kubeconfig", str(world.kubeconfigs[BOB]),
             "--proxy-url", world.proxy.base_url],
            stdout=out, stderr=subprocess.PIPE, text=False, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    by_conversation: dict[str, list[str]] = {}
    for line in lines:
        by_conversation.setdefault(line["conversationId"], []).append(line["content"])
        assert line["author"] == f"{world.namespace}/{AGENT}" and line["ts"] > 0
    assert by_conversation == {c: [text for _, text in turns] for c, turns in {**TURNS, **USER_TURNS}.items()}
    one = world.kubectl(BOB, "export", AGENT, "c2")
    assert [json.loads(line)["content"] for line in one.out.splitlines()] == [t for _, t in TURNS["c2"]]


def test_a_reader_may_not_erase_and_is_told_who_cannot_do_what(world: MemoryWorld) -> None:
    before = world.stored_keys()
    done = world.kubectl(BOB, "erase", AGENT, "c1", "--yes")
    assert done.code == 1
    expected = (
        f"Forbidden: user '{world.person(BOB)}' cannot delete agentdeployments/memory '{AGENT}' "
        f"in namespace '{world.namespace}'"
    )
    assert done.err.strip() == expected
    assert world.stored_keys() == before


def test_a_person_without_the_memory_permission_may_not_even_list(world: MemoryWorld) -> None:
    done = world.kubectl(CAROL, "conversations", AGENT)
    assert done.code == 1 and done.err.startswith(f"Forbidden: user '{world.person(CAROL)}' cannot list")
    shown = world.kubectl(CAROL, "show", AGENT, "c1")
    assert shown.code == 1 and "cannot get agentdeployments/memory" in shown.err


def test_erase_receipts_name_exactly_what_left_valkey(world: MemoryWorld) -> None:
    before = world.stored_keys()
    one = world.kubectl(ALICE, "erase", AGENT, "c1", "--yes", "-o", "json")
    assert one.code == 0, one.err
    receipt = json.loads(one.out)
    assert receipt["erasedBy"] == world.person(ALICE) and receipt["entries"] == len(TURNS["c1"])
    assert set(receipt["keys"]) == before - world.stored_keys() == {world.prefix() + "c1"}

    before = world.stored_keys()
    user = world.kubectl(ALICE, "erase", AGENT, "--user", END_USER, "--yes", "-o", "json")
    receipt = json.loads(user.out)
    assert receipt["user"] == END_USER and set(receipt["keys"]) == before - world.stored_keys()
    assert len(receipt["keys"]) == 1 and receipt["keys"][0].endswith(":u1")

    before = world.stored_keys()
    everything = world.kubectl(ALICE, "erase", AGENT, "--all", "--yes")
    assert everything.code == 0, everything.err
    assert world.stored_keys() == set() and before
    assert f"Erased by {world.person(ALICE)}" in everything.out
    assert all(f"  {key}" in everything.out for key in before)


def test_erase_without_yes_and_no_terminal_refuses_and_erases_nothing(world: MemoryWorld) -> None:
    before = world.stored_keys()
    done = world.kubectl(ALICE, "erase", AGENT, "--all")
    assert done.code == 1 and "without --yes" in done.err
    assert world.stored_keys() == before


def test_a_client_certificate_user_is_told_what_to_do(world: MemoryWorld, tmp_path: Path) -> None:
    config = world.cluster.kubeconfig_dict()
    certificate = {"client-certificate": str(world.cluster.client_cert_path)}
    certificate["client-key"] = str(world.cluster.client_key_path)
    config["users"] = [{"name": "admin", "user": certificate}]
    path = tmp_path / "cert.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    world.kubeconfigs["cert-user"] = path
    done = world.kubectl("cert-user", "conversations", AGENT)
    assert done.code == 1 and "client certificate" in done.err and "token" in done.err


@pytest.mark.parametrize(
    "command",
    [
        ("erase", "supprot-agent", "--all", "--yes"),
        ("erase", "supprot-agent", "c1", "--yes"),
        ("conversations", "supprot-agent"),
        ("show", "supprot-agent", "c1"),
        ("export", "supprot-agent"),
        ("status", "supprot-agent"),
    ],
    ids=["erase-all", "erase-one", "conversations", "show", "export", "status"],
)
def test_a_misspelt_agent_is_an_error_not_an_empty_answer(world: MemoryWorld, command: tuple[str, ...]) -> None:
    before = world.stored_keys()
    done = world.kubectl(ALICE, *command)
    assert done.code == 1, done.out
    assert done.err.startswith(f'NotFound: no AgentDeployment "supprot-agent" in namespace {world.namespace}')
    assert done.out == ""
    assert world.stored_keys() == before
