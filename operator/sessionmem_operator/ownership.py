"""Which existing objects the operator may write: only those an AgentDeployment already controls. Pure.

The operator force-applies its children, which would rewrite (and, through the owner reference it adds,
hand to the garbage collector) any object that merely shares a child's name: a Service, a Knative
Service or a `sessionmem-<name>` ServiceAccount made by someone else. So before any write the operator
reads every child and decides here. Fail-closed: an object is ours only when its controller owner
reference is this very AgentDeployment (same uid); labels and field managers are not proof, anyone who
can create the object can set them. One child that is not ours and nothing at all is written for the
agent (a workload applied beside someone else's ServiceAccount would run with that identity); the agent
reports ``NameConflict`` until the object goes away.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sessionmem_core import kube
from sessionmem_operator.wiring import MemoryReason

NAME_CONFLICT = MemoryReason.NAME_CONFLICT.value

Manifest = Mapping[str, Any]


def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = body.get("metadata") or {}
    return meta if isinstance(meta, Mapping) else {}


def controller_ref(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference marked as controller, whatever its kind."""
    for ref in _meta(body).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller"):
            return ref
    return None


def controller_of(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the AgentDeployment controlling a child object, if one does."""
    ref = controller_ref(body)
    if ref is not None and ref.get("apiVersion") == kube.API_VERSION and ref.get("kind") == kube.AGENT_KIND:
        return str(ref.get("name")), str(ref.get("uid"))
    return None


def owned_by(body: Mapping[str, Any], agent_uid: str) -> bool:
    owner = controller_of(body)
    return owner is not None and owner[1] == agent_uid


@dataclass(frozen=True, slots=True)
class Write:
    """A child to apply, and the incarnation it may land on: the uid of the object found (ours), or None
    when none exists (the apply must then create it, never take over one made meanwhile)."""

    manifest: Manifest
    uid: str | None


@dataclass(frozen=True, slots=True)
class Conflict:
    """A child's name taken by an object that is not this AgentDeployment's."""

    kind: str
    name: str
    held_by: str  # who controls it, in words

    def describe(self) -> str:
        return f'{self.kind} "{self.name}" ({self.held_by})'


@dataclass(frozen=True, slots=True)
class Plan:
    writes: tuple[Write, ...]  # empty when there is any conflict
    conflicts: tuple[Conflict, ...]

    @property
    def blocked(self) -> bool:
        return bool(self.conflicts)


def _held_by(existing: Mapping[str, Any], agent_name: str) -> str:
    ref = controller_ref(existing)
    if ref is None:
        return "not created by the operator for this AgentDeployment"
    kind, name = str(ref.get("kind")), str(ref.get("name"))
    if ref.get("apiVersion") == kube.API_VERSION and kind == kube.AGENT_KIND and name == agent_name:
        # The usual case right after an AgentDeployment is deleted and re-created: it clears by itself.
        return "left by an earlier AgentDeployment of this name, awaiting garbage collection"
    return f"controlled by {kind} {name}"


def plan_writes(agent_name: str, agent_uid: str, children: Sequence[tuple[Manifest, Mapping[str, Any] | None]]) -> Plan:
    """Decide the writes for the rendered children, each paired with the object of its name found in the
    cluster (None: none). Fail-closed: any child whose name is held by an object this AgentDeployment
    does not control blocks every write."""
    writes: list[Write] = []
    conflicts: list[Conflict] = []
    for manifest, existing in children:
        if existing is None:
            writes.append(Write(manifest, None))
        elif owned_by(existing, agent_uid):
            writes.append(Write(manifest, str(_meta(existing).get("uid") or "") or None))
        else:
            name = str(_meta(manifest).get("name"))
            conflicts.append(Conflict(str(manifest.get("kind")), name, _held_by(existing, agent_name)))
    if conflicts:
        return Plan((), tuple(conflicts))
    return Plan(tuple(writes), ())


def conflict_message(conflicts: Sequence[Conflict], resync_seconds: float) -> str:
    """What is in the way, that it is left alone, and the fix."""
    what = ", ".join(c.describe() for c in conflicts)
    return (
        f"the name of a child object is taken: {what}; the operator leaves it untouched and creates "
        "nothing for this agent. Delete or rename that object, or give the AgentDeployment another name: "
        f"the agent is set up within {resync_seconds:g}s of the name being free"
    )
