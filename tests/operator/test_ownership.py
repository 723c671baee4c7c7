"""Which existing objects the operator may write (pure): only those this AgentDeployment controls."""

from __future__ import annotations

from typing import Any

import pytest

from sessionmem_core import kube
from sessionmem_operator.ownership import NAME_CONFLICT, conflict_message, owned_by, plan_writes

AGENT = "support-agent"
UID = "0b9d7c1e-0000-4000-8000-000000000001"


def child(kind: str = "Service", name: str = AGENT) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "my-team"}}


def existing(*owners: dict[str, Any], uid: str = "object-uid", labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": AGENT, "namespace": "my-team", "uid": uid, "ownerReferences": list(owners)}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta}


def agent_ref(uid: str = UID, *, controller: bool = True, name: str = AGENT) -> dict[str, Any]:
    return {"apiVersion": kube.API_VERSION, "kind": kube.AGENT_KIND, "name": name, "uid": uid, "controller": controller}


def test_a_free_name_is_created_and_never_taken_over() -> None:
    plan = plan_writes(AGENT, UID, [(child(), None)])
    assert not plan.blocked
    (write,) = plan.writes
    assert write.uid is None  # the apply must create, not land on an object made meanwhile


def test_an_object_this_agent_controls_is_updated_in_place() -> None:
    plan = plan_writes(AGENT, UID, [(child(), existing(agent_ref()))])
    assert [w.uid for w in plan.writes] == ["object-uid"]
    assert owned_by(existing(agent_ref()), UID)


@pytest.mark.parametrize(
    ("found", "held_by"),
    [
        (existing(), "not created by the operator"),
        # The operator's labels prove nothing: anyone who can create a Service can set them.
        (
            existing(labels={kube.LABEL_MANAGED_BY: kube.MANAGED_BY, kube.LABEL_AGENT: AGENT}),
            "not created by the operator",
        ),
        (existing(agent_ref(controller=False)), "not created by the operator"),
        (existing(agent_ref(uid="earlier-incarnation")), "awaiting garbage collection"),
        (existing(agent_ref(uid="other-uid", name="other-agent")), "controlled by AgentDeployment other-agent"),
        (
            existing(
                {"apiVersion": "serving.knative.dev/v1", "kind": "Route", "name": AGENT, "uid": "r", "controller": True}
            ),
            "controlled by Route support-agent",
        ),
    ],
    ids=["no-owner", "our-labels-only", "owner-not-controller", "earlier-incarnation", "other-agent", "knative-route"],
)
def test_an_object_this_agent_does_not_control_blocks_every_write(found: dict[str, Any], held_by: str) -> None:
    account = child("ServiceAccount", f"sessionmem-{AGENT}")
    plan = plan_writes(AGENT, UID, [(account, None), (child(), found)])
    assert plan.blocked
    assert plan.writes == ()  # fail-closed: not even the free ServiceAccount is written
    (conflict,) = plan.conflicts
    assert (conflict.kind, conflict.name) == ("Service", AGENT)
    assert held_by in conflict.held_by


def test_the_message_names_every_conflict_and_the_fix() -> None:
    found = [(child("ServiceAccount", "sessionmem-x"), existing()), (child(), existing())]
    plan = plan_writes(AGENT, UID, found)
    message = conflict_message(plan.conflicts, 60.0)
    assert 'ServiceAccount "sessionmem-x"' in message and f'Service "{AGENT}"' in message
    assert "untouched" in message and "Delete or rename" in message and "60s" in message
    assert NAME_CONFLICT == "NameConflict"
