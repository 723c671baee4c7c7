"""Status computation (pure): Ready mirrors the workload, MemoryReady the wiring, no needless writes."""

from __future__ import annotations

from typing import Any

from sessionmem_core.errors import BackendUnavailable
from sessionmem_core.keys import Scope
from sessionmem_operator.backend import UNKNOWN, judge
from sessionmem_operator.render import ObjectRef
from sessionmem_operator.status import (
    Condition,
    WorkloadState,
    condition_of,
    deployment_state,
    knative_state,
    memory_condition,
    merge_conditions,
    reconciled_status,
    status_patch,
    workload_status,
)
from sessionmem_operator.wiring import MemoryReason, MemoryResolution

KSVC = ObjectRef("serving.knative.dev/v1", "Service", "support-agent")
WIRED = MemoryResolution(MemoryReason.WIRED, "wired", Scope.SESSION, None, "mem:ns/a:", ready=True)
T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def ksvc(generation: int, observed: int | None, ready: str | None, **status: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": "support-agent", "generation": generation}, "status": dict(status)}
    if observed is not None:
        body["status"]["observedGeneration"] = observed
    if ready is not None:
        body["status"]["conditions"] = [{"type": "Ready", "status": ready, "reason": "R", "message": "M"}]
    return body


def test_knative_ready_is_mirrored_once_the_generation_is_observed() -> None:
    state = knative_state(ksvc(2, 2, "True", url="http://a.ns.example.com", latestCreatedRevisionName="a-00002"))
    assert state.ready.status == "True"
    assert state.url == "http://a.ns.example.com"
    assert state.latest_revision == "a-00002"
    assert knative_state(ksvc(2, 2, "False")).ready.status == "False"


def test_a_stale_knative_ready_does_not_count() -> None:
    state = knative_state(ksvc(3, 2, "True"))
    assert state.ready.status == "Unknown"
    assert state.ready.reason == "Deploying"


def test_knative_without_status_is_unknown_and_missing_is_false() -> None:
    assert knative_state(ksvc(1, None, None)).ready.status == "Unknown"
    assert knative_state(None).ready.status == "False"


def deployment(generation: int, observed: int, available: str | None, ready_replicas: int) -> dict[str, Any]:
    status: dict[str, Any] = {
        "observedGeneration": observed,
        "updatedReplicas": ready_replicas,
        "availableReplicas": ready_replicas,
    }
    if available is not None:
        status["conditions"] = [{"type": "Available", "status": available, "reason": "MinimumReplicasUnavailable"}]
    return {"metadata": {"name": "a", "generation": generation}, "spec": {"replicas": 1}, "status": status}


def test_deployment_ready_needs_an_available_complete_rollout() -> None:
    assert deployment_state(deployment(1, 1, "True", 1), "ns").ready.status == "True"
    assert deployment_state(deployment(1, 1, "False", 0), "ns").ready.status == "False"
    assert deployment_state(deployment(2, 1, "True", 1), "ns").ready.status == "Unknown"
    assert deployment_state(deployment(1, 1, None, 0), "ns").ready.status == "Unknown"
    assert deployment_state(deployment(1, 1, "True", 1), "ns").url == "http://a.ns.svc:80"


def test_last_transition_time_moves_only_when_the_status_changes() -> None:
    first = merge_conditions([], [Condition("Ready", "Unknown", "Deploying", "m")], 1, T0)
    same = merge_conditions(first, [Condition("Ready", "Unknown", "Deploying", "other message")], 2, T1)
    assert same[0]["lastTransitionTime"] == T0
    assert same[0]["observedGeneration"] == 2
    changed = merge_conditions(same, [Condition("Ready", "True", "ServiceReady", "m")], 2, T1)
    assert changed[0]["lastTransitionTime"] == T1


def test_conditions_are_ordered_and_others_kept() -> None:
    merged = merge_conditions(
        [{"type": "Custom", "status": "True"}],
        [Condition("MemoryReady", "True", "Wired", ""), Condition("Ready", "True", "R", "")],
        1,
        T0,
    )
    assert [c["type"] for c in merged] == ["Ready", "MemoryReady", "Custom"]


def test_reconciled_status_and_a_no_op_recompute() -> None:
    state = WorkloadState(Condition("Ready", "Unknown", "Deploying", "m"))
    desired = reconciled_status({}, generation=4, resolution=WIRED, workload_ref=KSVC, state=state, now=T0)
    assert desired["observedGeneration"] == 4
    assert desired["scope"] == "session"
    assert desired["keyPrefix"] == "mem:ns/a:"
    assert desired["workload"] == {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "support-agent"}
    memory = condition_of(desired, "MemoryReady")
    assert memory is not None and memory["status"] == "True" and memory["reason"] == "Wired"
    # Stored as-is (None fields dropped, as a merge patch does), recomputing later changes nothing.
    stored = {k: v for k, v in desired.items() if v is not None}
    again = reconciled_status(stored, generation=4, resolution=WIRED, workload_ref=KSVC, state=state, now=T1)
    assert status_patch(stored, again) is None


def test_disabling_memory_removes_scope_and_prefix() -> None:
    state = WorkloadState(Condition("Ready", "True", "R", "m"))
    stored = reconciled_status({}, generation=1, resolution=WIRED, workload_ref=KSVC, state=state, now=T0)
    disabled = MemoryResolution(MemoryReason.DISABLED, "off")
    desired = reconciled_status(stored, generation=2, resolution=disabled, workload_ref=KSVC, state=state, now=T1)
    patch = status_patch(stored, desired)
    assert patch is not None
    assert patch["scope"] is None and patch["keyPrefix"] is None
    memory = condition_of(desired, "MemoryReady")
    assert memory is not None and (memory["status"], memory["reason"]) == ("False", "Disabled")


def test_workload_status_touches_only_ready_url_and_revision() -> None:
    state = WorkloadState(Condition("Ready", "Unknown", "Deploying", "m"))
    stored = reconciled_status({}, generation=1, resolution=WIRED, workload_ref=KSVC, state=state, now=T0)
    ready = WorkloadState(Condition("Ready", "True", "Ready", "up"), url="http://x", latest_revision="a-00001")
    desired = workload_status(stored, state=ready, now=T1)
    patch = status_patch(stored, desired)
    assert patch is not None and set(patch) == {"conditions", "url", "latestRevision"}
    assert condition_of(desired, "MemoryReady") == condition_of(stored, "MemoryReady")
    ready_condition = condition_of(desired, "Ready")
    assert ready_condition is not None and ready_condition["status"] == "True"


# ---- MemoryReady follows health (issue #37) -------------------------------------------------------------

PROXY = "http://proxy.sessionmem.svc:8000"
DEPLOYING = Condition("Ready", "Unknown", "Deploying", "rolling out")
FAILED = Condition("Ready", "False", "RevisionFailed", "Container failed with: ModuleNotFoundError")


def test_memory_is_ready_only_when_wired_running_and_the_backend_is_up() -> None:
    up = judge(PROXY, 200, b'{"status":"ready"}')
    assert up.ok is True
    assert (memory_condition(WIRED, DEPLOYING, up).status, memory_condition(WIRED, DEPLOYING, UNKNOWN).status) == (
        "True",
        "True",
    )

    down = judge(PROXY, 503, BackendUnavailable("memory backend unavailable: TimeoutError").body())
    condition = memory_condition(WIRED, DEPLOYING, down)
    assert (condition.status, condition.reason) == ("False", "MemoryBackendUnavailable")
    assert f"{PROXY}/readyz" in condition.message and "memory backend unavailable: TimeoutError" in condition.message

    unreachable = judge(PROXY, None, b"", ConnectionRefusedError(111, "Connection refused"))
    condition = memory_condition(WIRED, DEPLOYING, unreachable)
    assert (condition.status, condition.reason) == ("False", "ProxyUnreachable")
    assert "Connection refused" in condition.message

    # Failed pods come before the backend; the wiring before both.
    condition = memory_condition(WIRED, FAILED, down)
    assert (condition.status, condition.reason) == ("False", "AgentNotRunning")
    assert "ModuleNotFoundError" in condition.message
    disabled = MemoryResolution(MemoryReason.DISABLED, "off")
    assert memory_condition(disabled, FAILED, down).reason == "Disabled"
