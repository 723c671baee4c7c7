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


def registry_status(body: Mapping[str, Any]) -> dict[str, Any]:
    members = sorted(spec_members(body))
    return {
        "observedGeneration": int((body.get("metadata") or {}).get("generation") or 0),
        "memberCount": len(members),
        "members": [member.as_dict() for member in members],
        "keyPrefix": shared_prefix(str(body["metadata"]["name"])),
    }


def registry_up_to_date(body: Mapping[str, Any]) -> bool:
    """True when status already records the current spec: the event is our own status write (or a
    restart), and no agent needs re-wiring."""
    status = body.get("status") or {}
    wanted = registry_status(body)
    return all(status.get(key) == value for key, value in wanted.items())
