"""AgentDeployment status, computed from what the operator resolved and what the workload reports. Pure:
the clock is a parameter, so a recomputation with nothing new is equal to the stored status and no write
happens.

- ``Ready`` mirrors the workload: Knative's own Ready condition, or a Deployment's rollout and
  Available condition, and only once the workload has observed its latest generation (a stale Ready=True
  from the previous revision must not survive a change).
- ``MemoryReady`` is True when a memory call from the agent can succeed, else False with the reason and
  the fix. First the wiring (``Disabled``, ``NotARegistryMember``, ``AmbiguousRegistry``,
  ``NoProxyConfigured``, ``UnknownRedactor``, ``UserCapabilityKeyMissing``, ``KnativeServingNotInstalled``,
  ``NameConflict``), then health: the agent's pods failing (``AgentNotRunning``: the launcher that serves
  memory runs in them, e.g. it exits on a tokenCounter it cannot import), then the proxy's readiness
  (``MemoryBackendUnavailable``, ``ProxyUnreachable``; backend.py). True may carry a warning reason
  (``BackendAddrIgnored``).
- Both are False with ``NameConflict`` when a child's name is held by an object the AgentDeployment does
  not control (ownership.py): nothing is applied then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sessionmem_operator.backend import UNKNOWN, BackendHealth
from sessionmem_operator.render import DEPLOYMENT_KIND, KNATIVE_SERVICE_KIND, SERVICE_PORT, ObjectRef
from sessionmem_operator.wiring import MemoryReason, MemoryResolution

READY = "Ready"
MEMORY_READY = "MemoryReady"
# The fields of the status the operator owns outright; conditions are merged separately.
STATUS_FIELDS = ("observedGeneration", "scope", "registry", "keyPrefix", "workload", "latestRevision", "url")


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class WorkloadState:
    """What the workload says about itself, reduced to what the AgentDeployment status shows."""

    ready: Condition
    url: str | None = None
    latest_revision: str | None = None


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def memory_condition(
    resolution: MemoryResolution, ready: Condition | None = None, backend: BackendHealth = UNKNOWN
) -> Condition:
    """MemoryReady from the wiring, the workload's Ready and the backend's health, in that order: the
    first that fails names the reason. A workload still deploying (Ready Unknown) or scaled to zero
    (Knative: Ready True) does not hold memory back; one that failed (Ready False) does."""
    if not resolution.ready:
        return Condition(MEMORY_READY, "False", resolution.reason.value, resolution.message)
    if ready is not None and ready.status == "False":
        message = (
            "memory is served by the launcher in the agent's pods, and they are not running "
            f"(Ready: {ready.reason}: {ready.message}); see `kubectl logs` of the sessionmem-launcher container"
        )
        return Condition(MEMORY_READY, "False", MemoryReason.AGENT_NOT_RUNNING.value, message)
    if backend.ok is False and backend.reason is not None:
        return Condition(MEMORY_READY, "False", backend.reason.value, backend.message)
    return Condition(MEMORY_READY, "True", resolution.reason.value, resolution.message)


def _generation_seen(workload: Mapping[str, Any]) -> bool:
    generation = (workload.get("metadata") or {}).get("generation")
    observed = (workload.get("status") or {}).get("observedGeneration")
    return generation is None or (observed is not None and int(observed) >= int(generation))


def _find(conditions: object, type_: str) -> Mapping[str, Any] | None:
    if not isinstance(conditions, list):
        return None
    for condition in conditions:
        if isinstance(condition, Mapping) and condition.get("type") == type_:
            return condition
    return None


def knative_state(workload: Mapping[str, Any] | None) -> WorkloadState:
    if workload is None:
        return WorkloadState(Condition(READY, "False", "WorkloadMissing", "the Knative Service does not exist"))
    status = workload.get("status") or {}
    url = status.get("url") or None
    revision = status.get("latestCreatedRevisionName") or None
    generation = (workload.get("metadata") or {}).get("generation")
    if not _generation_seen(workload):
        message = f"waiting for Knative to reconcile generation {generation} of the Service"
        return WorkloadState(Condition(READY, "Unknown", "Deploying", message), url, revision)
    ready = _find(status.get("conditions"), "Ready")
    if ready is None:
        message = "the Knative Service reports no Ready condition yet"
        return WorkloadState(Condition(READY, "Unknown", "Deploying", message), url, revision)
    state = str(ready.get("status") or "Unknown")
    if state not in ("True", "False", "Unknown"):
        state = "Unknown"
    reason = str(ready.get("reason") or ("ServiceReady" if state == "True" else "Deploying"))
    message = str(ready.get("message") or f"Knative Service Ready={state}")
    return WorkloadState(Condition(READY, state, reason, message), url, revision)


def deployment_state(workload: Mapping[str, Any] | None, namespace: str) -> WorkloadState:
    if workload is None:
        return WorkloadState(Condition(READY, "False", "WorkloadMissing", "the Deployment does not exist"))
    meta = workload.get("metadata") or {}
    url = f"http://{meta.get('name')}.{namespace}.svc:{SERVICE_PORT}"
    if not _generation_seen(workload):
        message = f"waiting for the Deployment controller to observe generation {meta.get('generation')}"
        return WorkloadState(Condition(READY, "Unknown", "Deploying", message), url)
    status = workload.get("status") or {}
    wanted = int((workload.get("spec") or {}).get("replicas", 1))
    updated = int(status.get("updatedReplicas") or 0)
    available = int(status.get("availableReplicas") or 0)
    counts = f"{available}/{wanted} available, {updated}/{wanted} updated"
    condition = _find(status.get("conditions"), "Available")
    if condition is not None and condition.get("status") == "True" and updated >= wanted and available >= wanted:
        return WorkloadState(Condition(READY, "True", "DeploymentAvailable", counts), url)
    if condition is not None and condition.get("status") == "False":
        reason = str(condition.get("reason") or "DeploymentUnavailable")
        return WorkloadState(Condition(READY, "False", reason, f"{condition.get('message') or ''} ({counts})"), url)
    return WorkloadState(Condition(READY, "Unknown", "Deploying", f"rolling out: {counts}"), url)


def workload_state(workload_ref: ObjectRef, workload: Mapping[str, Any] | None, namespace: str) -> WorkloadState:
    kind = (workload_ref.api_version, workload_ref.kind)
    if kind == KNATIVE_SERVICE_KIND:
        return knative_state(workload)
    if kind == DEPLOYMENT_KIND:
        return deployment_state(workload, namespace)
    raise ValueError(f"not a workload kind: {kind}")


def merge_conditions(
    previous: Sequence[Mapping[str, Any]], updates: Sequence[Condition], generation: int, now: str
) -> list[dict[str, Any]]:
    """Replace the conditions named in `updates`, keeping lastTransitionTime when the status is unchanged
    and every other condition as it was."""
    by_type = {str(c.get("type")): dict(c) for c in previous if isinstance(c, Mapping) and c.get("type")}
    for update in updates:
        old = by_type.get(update.type)
        changed = old is None or old.get("status") != update.status
        by_type[update.type] = {
            "type": update.type,
            "status": update.status,
            "reason": update.reason,
            "message": update.message,
            "lastTransitionTime": now if changed or old is None else old.get("lastTransitionTime", now),
            "observedGeneration": generation,
        }
    order = [READY, MEMORY_READY]
    return sorted(by_type.values(), key=lambda c: (order.index(c["type"]) if c["type"] in order else 99, c["type"]))


def condition_of(status: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    return _find(status.get("conditions"), type_)


def _workload_fields(state: WorkloadState) -> dict[str, Any]:
    return {"url": state.url, "latestRevision": state.latest_revision}


def reconciled_status(
    previous: Mapping[str, Any],
    *,
    generation: int,
    resolution: MemoryResolution,
    workload_ref: ObjectRef | None,
    state: WorkloadState,
    now: str,
    backend: BackendHealth = UNKNOWN,
) -> dict[str, Any]:
    """The whole status after a reconcile (`workload_ref` None: no workload is the agent's yet). Fields set
    to None are removed (merge-patch semantics)."""
    memory = memory_condition(resolution, state.ready, backend)
    conditions = merge_conditions(previous.get("conditions") or [], [state.ready, memory], generation, now)
    return {
        "observedGeneration": generation,
        "conditions": conditions,
        "scope": resolution.scope.value if resolution.scope is not None else None,
        "registry": resolution.registry,
        "keyPrefix": resolution.key_prefix,
        "workload": (
            {"apiVersion": workload_ref.api_version, "kind": workload_ref.kind, "name": workload_ref.name}
            if workload_ref is not None
            else None
        ),
        **_workload_fields(state),
    }


def workload_status(previous: Mapping[str, Any], *, state: WorkloadState, now: str) -> dict[str, Any]:
    """The status after a workload event: Ready and the workload's URL/revision change, the rest stays."""
    generation = int(previous.get("observedGeneration") or 0)
    conditions = merge_conditions(previous.get("conditions") or [], [state.ready], generation, now)
    kept = {key: previous.get(key) for key in STATUS_FIELDS}
    return {**kept, "conditions": conditions, **_workload_fields(state)}


def status_patch(previous: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch from `previous` to `desired`, or None when nothing changes (no write, no event)."""
    patch = {key: value for key, value in desired.items() if previous.get(key) != value}
    # A None only matters if there is something to remove.
    patch = {key: value for key, value in patch.items() if value is not None or key in previous}
    return patch or None
