"""AgentRegistry membership (pure)."""

from __future__ import annotations

from typing import Any

from sessionmem_operator.registry import (
    MemberRef,
    affected_members,
    index_entries,
    registries_for,
    registry_status,
    registry_up_to_date,
)


def registry(
    members: list[dict[str, str]], recorded: list[dict[str, str]] | None = None, **status: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": "support-team", "generation": 2}, "spec": {"members": members}}
    if recorded is not None:
        body["status"] = {"members": recorded, **status}
    return body


A = {"namespace": "ns", "name": "a"}
B = {"namespace": "ns", "name": "b"}


def test_index_entries_map_members_to_the_registry() -> None:
    assert index_entries("support-team", registry([A, B])) == {("ns", "a"): "support-team", ("ns", "b"): "support-team"}
    assert index_entries("empty", {"metadata": {"name": "empty"}, "spec": {}}) == {}


def test_registries_for_sorts_and_dedupes() -> None:
    index = {("ns", "a"): ["z-team", "a-team", "z-team"]}
    assert registries_for("ns", "a", index) == ("a-team", "z-team")
    assert registries_for("ns", "missing", index) == ()


def test_affected_members_include_the_dropped_ones() -> None:
    assert affected_members(registry([A], recorded=[A, B])) == {MemberRef("ns", "a"), MemberRef("ns", "b")}
    assert affected_members(registry([A, B])) == {MemberRef("ns", "a"), MemberRef("ns", "b")}


def test_registry_status_and_up_to_date() -> None:
    body = registry([B, A])
    status = registry_status(body)
    assert status == {
        "observedGeneration": 2,
        "memberCount": 2,
        "members": [A, B],
        "keyPrefix": "mem:shared:support-team:",
    }
    assert not registry_up_to_date(body)
    assert registry_up_to_date({**body, "status": status})
