"""Reconciliation: read the cluster, call the pure functions, write the result. The kopf handlers
(handlers.py) only route events here.

Every write is a server-side apply or a merge patch of the status, so running a reconcile twice changes
nothing the second time. Within the process all work on one agent is serialised by a per-agent lock,
because three event sources reach the same agent: its own changes, its workload's status, and the
AgentRegistries that list it.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sessionmem_operator import kubeapi, registry
from sessionmem_operator.backend import UNKNOWN, BackendHealth, BackendWatch
from sessionmem_operator.config import OperatorConfig
from sessionmem_operator.kubeapi import KubeApi, kind_of
from sessionmem_operator.ownership import (
    NAME_CONFLICT,
    Conflict,
    conflict_message,
    controller_of,
    owned_by,
    plan_writes,
)
from sessionmem_operator.render import KNATIVE_SERVICE_KIND, ObjectRef, render
from sessionmem_operator.spec import AgentSpec, SpecError, parse_agent
from sessionmem_operator.status import (
    MEMORY_READY,
    READY,
    Condition,
    WorkloadState,
    condition_of,
    now_rfc3339,
    reconciled_status,
    status_patch,
    workload_state,
    workload_status,
)
from sessionmem_operator.wiring import MemoryReason, MemoryResolution, resolve_memory

# (namespace, agent) -> registry names, as kept by kopf's index of AgentRegistries.
MembershipIndex = Mapping[tuple[str, str], Iterable[str]]
Logger = logging.Logger | logging.LoggerAdapter[Any]
# Posts a Warning Event about an object: kopf.warn in the operator, a recorder in tests.
WarningPoster = Callable[[Mapping[str, Any], str, str], None]


class ReconcileError(Exception):
    """A reconcile could not finish; `retriable` says whether trying again soon can help."""

    def __init__(self, message: str, *, retriable: bool) -> None:
        super().__init__(message)
        self.retriable = retriable


@dataclass
class Runtime:
    """Process-wide state of the operator, created at start-up and kept in kopf's memo."""

    config: OperatorConfig
    kube: KubeApi
    post_warning: WarningPoster
    # The proxy's health, followed into MemoryReady; None: not watched (no proxy, or memoryHealthSeconds 0).
    backend: BackendWatch | None = None
    _locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = field(
        default_factory=weakref.WeakValueDictionary
    )

    @property
    def backend_health(self) -> BackendHealth:
        return self.backend.current if self.backend is not None else UNKNOWN

    def lock_for(self, namespace: str, name: str) -> asyncio.Lock:
        # Weak values: a lock lives only while someone holds or waits for it, so the map does not grow
        # with every agent ever seen.
        lock = self._locks.get((namespace, name))
        if lock is None:
            lock = asyncio.Lock()
            self._locks[(namespace, name)] = lock
        return lock


def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = body.get("metadata") or {}
    return meta if isinstance(meta, Mapping) else {}


def _workload_ref_of(status: Mapping[str, Any]) -> ObjectRef | None:
    workload = status.get("workload")
    if not isinstance(workload, Mapping) or not all(workload.get(k) for k in ("apiVersion", "kind", "name")):
        return None
    return ObjectRef(str(workload["apiVersion"]), str(workload["kind"]), str(workload["name"]))


async def _remove_stale(runtime: Runtime, agent: AgentSpec, stale: Iterable[ObjectRef]) -> None:
    """Delete what the other execution model made, but only objects this AgentDeployment controls: e.g.
    Knative's own route Service has the agent's name too and must be left alone."""
    for ref in stale:
        kind = kind_of(ref.api_version, ref.kind)
        existing = await runtime.kube.get(kind, agent.namespace, ref.name)
        if existing is None:
            continue
        if owned_by(existing, agent.uid):
            await runtime.kube.delete(kind, agent.namespace, ref.name, uid=str(_meta(existing).get("uid")))


def _post_warning_on_transition(
    runtime: Runtime, body: Mapping[str, Any], previous: Mapping[str, Any], resolution: MemoryResolution
) -> None:
    """A Warning Event per finding when the wiring falls short of the request, once per change of the
    MemoryReady condition (a resync or a restart does not repeat them)."""
    if not resolution.warning:
        return
    old = condition_of(previous, MEMORY_READY)
    if old is not None and old.get("reason") == resolution.reason.value and old.get("message") == resolution.message:
        return
    for finding in resolution.findings:
        runtime.post_warning(body, finding.reason.value, finding.message)


async def _write_status(
    runtime: Runtime, namespace: str, name: str, previous: Mapping[str, Any], desired: Mapping[str, Any]
) -> bool:
    patch = status_patch(previous, desired)
    if patch is None:
        return False
    try:
        await runtime.kube.patch_status(kubeapi.AGENT_DEPLOYMENT, namespace, name, patch)
    except kubeapi.KubeError as exc:
        if exc.status == 404:
            return False  # deleted while it was reconciled: nothing left to record it on
        raise
    return True


KNATIVE_MISSING = MemoryReason.KNATIVE_SERVING_NOT_INSTALLED.value
KNATIVE_MISSING_MESSAGE = "Knative Serving is not installed; use executionModel: deployment"


def _apply_failure(
    exc: kubeapi.KubeError, workload: ObjectRef, resolution: MemoryResolution
) -> tuple[WorkloadState, MemoryResolution]:
    """Ready (and, when nothing could run, MemoryReady) after an apply the API server refused for good."""
    if exc.status == 404 and (workload.api_version, workload.kind) == KNATIVE_SERVICE_KIND:
        # The kind is not served at all: no pod will ever run, so no memory call either.
        ready = Condition(READY, "False", KNATIVE_MISSING, KNATIVE_MISSING_MESSAGE)
        if resolution.enabled:
            resolution = replace(
                resolution,
                reason=MemoryReason.KNATIVE_SERVING_NOT_INSTALLED,
                message=KNATIVE_MISSING_MESSAGE,
                ready=False,
            )
        return WorkloadState(ready), resolution
    return WorkloadState(Condition(READY, "False", "ApplyFailed", exc.message)), resolution


def _as_reconcile_error(exc: kubeapi.KubeError, what: str) -> ReconcileError:
    return ReconcileError(f"{what}: {exc}", retriable=exc.retriable)


async def _gone(runtime: Runtime, namespace: str, name: str) -> bool:
    """The AgentDeployment no longer exists, or is being deleted."""
    body = await runtime.kube.get(kubeapi.AGENT_DEPLOYMENT, namespace, name)
    return body is None or bool(_meta(body).get("deletionTimestamp"))


def name_of(manifest: Mapping[str, Any]) -> str:
    return str(_meta(manifest).get("name"))


async def _report_conflicts(
    runtime: Runtime,
    body: Mapping[str, Any],
    agent: AgentSpec,
    previous: Mapping[str, Any],
    resolution: MemoryResolution,
    conflicts: Iterable[Conflict],
    logger: Logger,
) -> None:
    """Say on the AgentDeployment (conditions, and a Warning Event once per change) which names are taken
    and how to free them. No workload is recorded: nothing was applied, and a workload event must not turn
    Ready back to True meanwhile."""
    message = conflict_message(tuple(conflicts), runtime.config.resync_seconds)
    ready = Condition(READY, "False", NAME_CONFLICT, message)
    if resolution.enabled:
        resolution = replace(resolution, reason=MemoryReason.NAME_CONFLICT, message=message, ready=False)
    desired = reconciled_status(
        previous,
        generation=agent.generation,
        resolution=resolution,
        workload_ref=None,
        state=WorkloadState(ready),
        now=now_rfc3339(),
    )
    old_ready = condition_of(previous, READY) or {}
    if (old_ready.get("reason"), old_ready.get("message")) != (NAME_CONFLICT, message):
        runtime.post_warning(body, NAME_CONFLICT, message)
        logger.info("AgentDeployment %s/%s: %s", agent.namespace, agent.name, message)
    await _write_status(runtime, agent.namespace, agent.name, previous, desired)


async def reconcile_agent(runtime: Runtime, namespace: str, name: str, index: MembershipIndex, logger: Logger) -> None:
    """Render and apply everything an AgentDeployment needs, then record the outcome in its status.

    Reads the object fresh (the event that triggered this may be older than its status)."""
    async with runtime.lock_for(namespace, name):
        try:
            await _reconcile_locked(runtime, namespace, name, index, logger)
        except kubeapi.KubeError as exc:
            raise _as_reconcile_error(exc, f"reconciling AgentDeployment {namespace}/{name}") from exc


async def _reconcile_locked(
    runtime: Runtime, namespace: str, name: str, index: MembershipIndex, logger: Logger
) -> None:
    body = await runtime.kube.get(kubeapi.AGENT_DEPLOYMENT, namespace, name)
    if body is None or _meta(body).get("deletionTimestamp"):
        return  # gone or going: the garbage collector removes what it owned
    try:
        agent = parse_agent(body)
    except SpecError as exc:
        raise ReconcileError(f"AgentDeployment {namespace}/{name}: {exc}", retriable=False) from exc
    previous: Mapping[str, Any] = body.get("status") or {}
    resolution = resolve_memory(agent, registry.registries_for(namespace, name, index), runtime.config)
    rendered = render(agent, resolution, runtime.config)

    found: list[tuple[Mapping[str, Any], Mapping[str, Any] | None]] = []
    for manifest in rendered.objects:
        kind = kind_of(manifest["apiVersion"], manifest["kind"])
        found.append((manifest, await runtime.kube.get(kind, namespace, name_of(manifest))))
    plan = plan_writes(agent.name, agent.uid, found)
    if plan.blocked:
        # Fail-closed: a name held by an object that is not ours stops every write for this agent, until
        # the periodic resync finds it free. Our own leftovers of the other execution model still go: after
        # serving -> deployment, Knative's route Service holds the name until our Knative Service is gone.
        if _workload_ref_of(previous) != rendered.workload:
            await _remove_stale(runtime, agent, rendered.stale)
        await _report_conflicts(runtime, body, agent, previous, resolution, plan.conflicts, logger)
        return
    applied: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        for write in plan.writes:
            kind_key = (str(write.manifest["apiVersion"]), str(write.manifest["kind"]))
            applied[kind_key] = await runtime.kube.apply(write.manifest, uid=write.uid)
    except kubeapi.KubeError as exc:
        if await _gone(runtime, namespace, name):
            # Deleted meanwhile: the garbage collector removes its children, even one created just now.
            return
        if not exc.retriable:
            # Say so on the object (e.g. a webhook or RBAC refusing the workload) before giving up.
            failed, resolution = _apply_failure(exc, rendered.workload, resolution)
            desired = reconciled_status(
                previous,
                generation=agent.generation,
                resolution=resolution,
                workload_ref=rendered.workload,
                state=failed,
                now=now_rfc3339(),
                backend=runtime.backend_health,
            )
            old_ready = condition_of(previous, READY) or {}
            knative_missing = failed.ready.reason == KNATIVE_MISSING
            if knative_missing and old_ready.get("reason") != KNATIVE_MISSING:
                runtime.post_warning(body, KNATIVE_MISSING, failed.ready.message)
            await _write_status(runtime, namespace, name, previous, desired)
            if knative_missing:
                # Said and final until the spec changes (a new event) or Knative is installed (the periodic
                # resync sees it): a pending retry would only delay the reconcile of the advised fix.
                return
        raise
    # Clean-up only matters after a change of execution model (or a first reconcile).
    if _workload_ref_of(previous) != rendered.workload:
        await _remove_stale(runtime, agent, rendered.stale)

    workload = applied[(rendered.workload.api_version, rendered.workload.kind)]
    state = workload_state(rendered.workload, workload, namespace)
    desired = reconciled_status(
        previous,
        generation=agent.generation,
        resolution=resolution,
        workload_ref=rendered.workload,
        state=state,
        now=now_rfc3339(),
        backend=runtime.backend_health,
    )
    _post_warning_on_transition(runtime, body, previous, resolution)
    if await _write_status(runtime, namespace, name, previous, desired):
        logger.info(
            "reconciled: %s, memory %s (%s), ready %s",
            rendered.workload.kind,
            resolution.reason.value,
            resolution.key_prefix or "no memory",
            state.ready.status,
        )


async def workload_changed(
    runtime: Runtime,
    event_type: str | None,
    workload: Mapping[str, Any],
    index: MembershipIndex,
    logger: Logger,
) -> None:
    """Mirror a workload's readiness into its AgentDeployment; re-create it if it was deleted from under a
    live AgentDeployment."""
    owner = controller_of(workload)
    meta = _meta(workload)
    namespace = str(meta.get("namespace") or "")
    if owner is None or not namespace:
        return
    name, uid = owner
    recreate = False
    # MemoryReady depends on whether the workload failed: a change into or out of Ready False takes a
    # whole reconcile (which computes both conditions), any other change only mirrors Ready.
    rewire = False
    async with runtime.lock_for(namespace, name):
        try:
            parent = await runtime.kube.get(kubeapi.AGENT_DEPLOYMENT, namespace, name)
            if parent is None or _meta(parent).get("uid") != uid or _meta(parent).get("deletionTimestamp"):
                return
            previous: Mapping[str, Any] = parent.get("status") or {}
            current = _workload_ref_of(previous)
            this = ObjectRef(str(workload.get("apiVersion")), str(workload.get("kind")), str(meta.get("name")))
            if current is None or current != this:
                return  # not (yet) the agent's workload: a stale one on its way out, or a first reconcile
            if event_type == "DELETED":
                recreate = True
            else:
                state = workload_state(this, workload, namespace)
                desired = workload_status(previous, state=state, now=now_rfc3339())
                if await _write_status(runtime, namespace, name, previous, desired):
                    logger.debug("AgentDeployment %s/%s: Ready %s", namespace, name, state.ready.status)
                failed_before = (condition_of(previous, READY) or {}).get("status") == "False"
                rewire = failed_before != (state.ready.status == "False")
        except kubeapi.KubeError as exc:
            raise _as_reconcile_error(exc, f"mirroring the workload status of {namespace}/{name}") from exc
    if recreate:
        logger.info("the workload of AgentDeployment %s/%s was deleted: re-creating it", namespace, name)
    if recreate or rewire:
        await reconcile_agent(runtime, namespace, name, index, logger)


async def registry_changed(
    runtime: Runtime,
    body: Mapping[str, Any],
    index: MembershipIndex,
    logger: Logger,
    *,
    deleted: bool,
) -> None:
    """Re-wire the agents a registry lists now or listed before, then record the members it wired.

    Members outside the watched namespaces are not attempted (the operator has no rights there: every try
    would be a 403): the registry's status and a Warning Event name them and the chart value to change.
    Every other affected agent is attempted; if any fails the status is not updated, so the next attempt
    (kopf's retry) sees the same affected set."""
    watched = runtime.config.namespaces
    if not deleted and registry.registry_up_to_date(body, watched):
        return
    affected = registry.affected_members(body)
    unreachable = registry.unreachable_members(affected, watched)
    reachable = sorted(affected - unreachable)
    results = await asyncio.gather(
        *(reconcile_agent(runtime, member.namespace, member.name, index, logger) for member in reachable),
        return_exceptions=True,
    )
    failures = [
        (member, result) for member, result in zip(reachable, results, strict=True) if isinstance(result, BaseException)
    ]
    for member, failure in failures:
        logger.warning("re-wiring %s/%s failed: %s", member.namespace, member.name, failure)
    if failures:
        retriable = all(isinstance(f, ReconcileError) and f.retriable for _, f in failures)
        raise ReconcileError(f"{len(failures)} of {len(reachable)} members could not be re-wired", retriable=retriable)
    if deleted:
        return
    registry_name = str(_meta(body).get("name"))
    status = registry.registry_status(body, watched)
    previous: Mapping[str, Any] = body.get("status") or {}
    now = now_rfc3339()
    for condition in status["conditions"]:
        old = condition_of(previous, str(condition["type"])) or {}
        same = old.get("status") == condition["status"]
        condition["lastTransitionTime"] = old.get("lastTransitionTime", now) if same else now
        if condition["status"] == "False" and (not same or old.get("message") != condition["message"]):
            runtime.post_warning(body, str(condition["reason"]), str(condition["message"]))
    try:
        await runtime.kube.patch_status(kubeapi.AGENT_REGISTRY, None, registry_name, status)
    except kubeapi.KubeError as exc:
        if exc.status != 404:  # deleted meanwhile: its DELETED event re-wires the members
            raise _as_reconcile_error(exc, f"recording the members of AgentRegistry {registry_name}") from exc
    logger.info("AgentRegistry %s: %d member(s) wired", registry_name, len(reachable))


async def resync_all(runtime: Runtime, index: MembershipIndex, logger: Logger) -> int:
    """Reconcile every AgentDeployment the operator watches, one at a time (a resync must not burst the
    API server); returns how many were reconciled. Failures are logged: the next resync tries again."""
    namespaces: Iterable[str | None] = runtime.config.namespaces or (None,)
    done = 0
    for namespace in namespaces:
        try:
            agents = await runtime.kube.list_names(kubeapi.AGENT_DEPLOYMENT, namespace)
        except kubeapi.KubeError as exc:
            logger.warning("resync: listing AgentDeployments failed: %s", exc)
            continue
        for agent_namespace, name in agents:
            try:
                await reconcile_agent(runtime, agent_namespace, name, index, logger)
                done += 1
            except ReconcileError as exc:
                logger.warning("resync of %s/%s failed: %s", agent_namespace, name, exc)
            except Exception:
                # One agent's unexpected failure never stops the others' repair (fail open for the sweep).
                logger.exception("resync of %s/%s failed unexpectedly", agent_namespace, name)
    return done
