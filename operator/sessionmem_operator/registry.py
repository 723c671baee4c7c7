"""AgentRegistry membership, as pure functions over API objects and kopf's in-memory index.

The index (``registries_by_member``: (namespace, agent) -> registry names) is kept by kopf from the
AgentRegistry watch and is complete before any handler runs, so an operator restart never sees an agent
as a non-member for a moment (which would roll a private-layout revision and back).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sessionmem_core.keys import shared_prefix


@dataclass(frozen=True, slots=True, order=True)
class MemberRef:
    namespace: str
    name: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def as_dict(self) -> dict[str, str]:
        return {"namespace": self.namespace, "name": self.name}


def _refs(items: object) -> frozenset[MemberRef]:
    if not isinstance(items, list):
        return frozenset()
    return frozenset(
        MemberRef(str(item["namespace"]), str(item["name"]))
        for item in items
        if isinstance(item, Mapping) and item.get("namespace") and item.get("name")
    )


def spec_members(body: Mapping[str, Any]) -> frozenset[MemberRef]:
    """The members the registry lists now."""
    return _refs((body.get("spec") or {}).get("members"))


def recorded_members(body: Mapping[str, Any]) -> frozenset[MemberRef]:
    """The members the operator last wired (status.members), so dropped agents can be re-wired."""
    return _refs((body.get("status") or {}).get("members"))


def affected_members(body: Mapping[str, Any]) -> frozenset[MemberRef]:
    """The agents whose wiring a registry event may change: those listed now and those wired before
    (for a deleted registry, both are the last state seen)."""
    return spec_members(body) | recorded_members(body)


def index_entries(registry_name: str, body: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """What one registry contributes to the kopf index."""
    return {member.key: registry_name for member in spec_members(body)}


def registries_for(namespace: str, name: str, index: Mapping[tuple[str, str], Iterable[str]]) -> tuple[str, ...]:
    """The registries listing the agent, sorted and without repeats."""
    return tuple(sorted(set(index.get((namespace, name), ()))))


# The registry's one condition: whether the operator could wire every member it lists.
MEMBERS_WIRED = "MembersWired"
OUTSIDE_WATCHED = "MembersOutsideWatchedNamespaces"
WATCH_NAMESPACES_VALUE = "operator.watchNamespaces"


def unreachable_members(members: Iterable[MemberRef], watched: Iterable[str]) -> frozenset[MemberRef]:
    """Members the operator may not touch: outside the namespaces it watches (empty `watched`: the whole
    cluster, so none). Reconciling them could only fail with 403, again and again."""
    namespaces = set(watched)
    if not namespaces:
        return frozenset()
    return frozenset(member for member in members if member.namespace not in namespaces)


def unreachable_message(unreachable: Iterable[MemberRef], watched: Iterable[str]) -> str:
    names = ", ".join(f"{m.namespace}/{m.name}" for m in sorted(unreachable))
    return (
        f"{names} outside the namespaces the operator watches ({', '.join(sorted(watched))}): not wired, so "
        f"they keep their private layout. Add their namespaces to the chart value {WATCH_NAMESPACES_VALUE} (or "
        "leave it empty to watch the whole cluster)"
    )


def registry_status(body: Mapping[str, Any], watched: Iterable[str] = ()) -> dict[str, Any]:
    members = sorted(spec_members(body))
    unreachable = sorted(unreachable_members(members, watched))
    if unreachable:
        condition = {"type": MEMBERS_WIRED, "status": "False", "reason": OUTSIDE_WATCHED}
        condition["message"] = unreachable_message(unreachable, watched)
    else:
        condition = {"type": MEMBERS_WIRED, "status": "True", "reason": "AllMembersWatched"}
        condition["message"] = f"all {len(members)} member(s) are in namespaces the operator watches"
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    return {
        "observedGeneration": generation,
        "memberCount": len(members),
        "members": [member.as_dict() for member in members],
        "unreachableMembers": [member.as_dict() for member in unreachable],
        "keyPrefix": shared_prefix(str(body["metadata"]["name"])),
        "conditions": [{**condition, "observedGeneration": generation}],
    }


def _without_times(conditions: object) -> object:
    if not isinstance(conditions, list):
        return conditions
    return [
        {k: v for k, v in c.items() if k != "lastTransitionTime"} if isinstance(c, Mapping) else c for c in conditions
    ]


def registry_up_to_date(body: Mapping[str, Any], watched: Iterable[str] = ()) -> bool:
    """True when status already records the current spec: the event is our own status write (or a
    restart), and no agent needs re-wiring."""
    status = body.get("status") or {}
    wanted = registry_status(body, watched)
    return all(
        _without_times(status.get(key)) == _without_times(value) if key == "conditions" else status.get(key) == value
        for key, value in wanted.items()
    )
