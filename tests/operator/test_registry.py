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
    spec_members,
    unreachable_members,
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
    conditions = status.pop("conditions")
    assert status == {
        "observedGeneration": 2,
        "memberCount": 2,
        "members": [A, B],
        "unreachableMembers": [],
        "keyPrefix": "mem:shared:support-team:",
    }
    assert [(c["type"], c["status"]) for c in conditions] == [("MembersWired", "True")]
    assert not registry_up_to_date(body)
    stored = {**status, "conditions": [{**conditions[0], "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    assert registry_up_to_date({**body, "status": stored})


def test_members_outside_the_watched_namespaces_are_named_with_the_fix() -> None:
    other = {"namespace": "elsewhere", "name": "c"}
    body = registry([A, other])
    assert unreachable_members(spec_members(body), ()) == frozenset()  # cluster-wide: all reachable
    assert unreachable_members(spec_members(body), ("ns",)) == {MemberRef("elsewhere", "c")}
    status = registry_status(body, ("ns",))
    assert status["unreachableMembers"] == [other]
    (condition,) = status["conditions"]
    assert (condition["status"], condition["reason"]) == ("False", "MembersOutsideWatchedNamespaces")
    assert "elsewhere/c" in condition["message"] and "operator.watchNamespaces" in condition["message"]
    # The same registry is up to date for one operator and not for one that watches differently.
    recorded = {**body, "status": status}
    assert registry_up_to_date(recorded, ("ns",))
    assert not registry_up_to_date(recorded, ())
