"""The kopf handlers: thin routes from events to reconcile.py. Importing this module registers them.

Run with ``python -m sessionmem_operator`` (or ``kopf run -m sessionmem_operator.handlers -A``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import kopf

from sessionmem_core import kube
from sessionmem_operator import knative_watch, kubeapi, reconcile, registry
from sessionmem_operator.backend import BackendWatch
from sessionmem_operator.config import OperatorConfig
from sessionmem_operator.kopf_settings import apply_settings
from sessionmem_operator.kubeapi import KubeApi, own_namespace
from sessionmem_operator.reconcile import Logger, ReconcileError, Runtime

# Retried reconciles wait this long (seconds) when the error gives no better hint.
RETRY_DELAY = 5.0
# Refusals (4xx) are re-checked less often: most need a human (a webhook or RBAC refusing a child), and
# retrying one hot helps nobody. (A name held by another object is no error: NameConflict, see ownership.py.)
SLOW_RETRY_DELAY = 30.0
MAX_RETRY_DELAY = 900.0
# Registry deletions have no kopf retry (they arrive as plain watch events): a few attempts of our own.
DELETION_ATTEMPTS = 3

AGENTS = (kube.GROUP, kube.VERSION, kube.AGENT_PLURAL)
REGISTRIES = (kube.GROUP, kube.VERSION, kube.REGISTRY_PLURAL)
OWNED = {kube.LABEL_MANAGED_BY: kube.MANAGED_BY}

Index = kopf.Index[tuple[str, str], str]
# kopf hands an index to every handler as a keyword argument named after the index's id.
MEMBERSHIP_INDEX = "registries_by_member"


def _runtime(memo: Any) -> Runtime:
    runtime = memo.get("runtime")
    if not isinstance(runtime, Runtime):
        raise kopf.TemporaryError("the operator is still starting", delay=1)
    return runtime


def _index(kwargs: dict[str, Any]) -> Index:
    # kopf passes every index as a keyword named after its function; the handler protocols only allow
    # such extras through **kwargs.
    index: Index = kwargs[MEMBERSHIP_INDEX]
    return index


_LOG = logging.getLogger("sessionmem.operator")


def _post_warning(body: Any, reason: str, message: str) -> None:
    # An Event about a cluster-scoped object (an AgentRegistry) goes to the operator's own namespace; an
    # operator run outside a pod has none, and kopf would post to "default", which it may not write to.
    if not (body.get("metadata") or {}).get("namespace") and own_namespace() is None:
        _LOG.warning("%s %s: %s (no namespace of its own to post the Event in)", reason, body.get("kind"), message)
        return
    try:
        kopf.warn(body, reason=reason, message=message)
    except LookupError:
        # kopf posts Events only from its own per-object tasks; the resync task is none of them. The object's
        # status conditions carry the same reason, so the Event becomes a log line instead of an error.
        _LOG.warning("%s %s/%s: %s", reason, body.get("kind"), (body.get("metadata") or {}).get("name"), message)


def _retry(exc: ReconcileError, attempt: int) -> kopf.TemporaryError:
    if exc.retriable:
        return kopf.TemporaryError(str(exc), delay=RETRY_DELAY)
    # Refusals back off (30 s, 60 s, ... up to 15 min): retrying a 403 or a 404 hot helps nobody.
    return kopf.TemporaryError(str(exc), delay=min(SLOW_RETRY_DELAY * 2 ** min(attempt, 10), MAX_RETRY_DELAY))


@kopf.on.login()
async def login(**_: Any) -> kopf.ConnectionInfo:
    # Replaces kopf's default logins: kopf and our own client must use the same credentials.
    return await kubeapi.connection_info(await kubeapi.load_configuration())


async def _resync_forever(runtime: Runtime, index: Index, logger: Logger) -> None:
    """Re-apply every AgentDeployment every resyncSeconds, so drift (a deleted ServiceAccount, a hand-edited
    child) is repaired without waiting for a change to the AgentDeployment. One task for the operator, not
    a kopf daemon or timer per object: those need a finalizer, which would block deleting AgentDeployments
    whenever the operator is not running."""
    while True:
        await asyncio.sleep(runtime.config.resync_seconds)
        try:
            await reconcile.resync_all(runtime, index, logger)
        except Exception:
            # Fail open for the loop: a round that breaks is logged and the next one runs. A task that died
            # here would stop repairing drift for good, and its error would fail the cleanup on shutdown.
            logger.exception("resync round failed; the next one runs in %ss", runtime.config.resync_seconds)


async def _stop_task(task: asyncio.Task[None]) -> None:
    task.cancel()
    # Whatever ended the task, this returns: kopf retries a cleanup that raises every few seconds, and the
    # operator would never stop.
    await asyncio.gather(task, return_exceptions=True)


@kopf.on.startup()
async def start(*, settings: kopf.OperatorSettings, memo: Any, logger: Logger, **kwargs: Any) -> None:
    config = OperatorConfig.load()
    apply_settings(settings, config)
    runtime = Runtime(config=config, kube=await KubeApi.connect(), post_warning=_post_warning)
    memo["runtime"] = runtime
    # kopf hands startup handlers the (still filling) index too; it is the same live object later on.
    index = _index(kwargs)
    memo["resync"] = asyncio.create_task(_resync_forever(runtime, index, logger))

    async def knative_changed(event_type: str | None, body: Any) -> None:
        await reconcile.workload_changed(runtime, event_type, body, index, logger)

    memo["knative"] = [
        asyncio.create_task(knative_watch.watch_forever(runtime.kube, namespace, knative_changed, logger))
        for namespace in (config.namespaces or (None,))
    ]
    if config.proxy_url and config.memory_health_seconds > 0:
        # Probed once before the first reconcile, so no agent is reported ready on a backend known down.
        session = aiohttp.ClientSession()
        memo["health_session"] = session
        runtime.backend = BackendWatch(config.proxy_url, config.memory_health_seconds)
        await runtime.backend.check(session)
        memo["health"] = asyncio.create_task(
            runtime.backend.run(session, lambda: reconcile.resync_all(runtime, index, logger))
        )
    mode = f"via proxy {config.proxy_url}" if config.proxy_url else "off (no proxy URL configured)"
    logger.info("sessionmem operator: launcher %s, memory %s", config.launcher_image, mode)


@kopf.on.cleanup()
async def stop(*, memo: Any, **_: Any) -> None:
    tasks = [memo.get("resync"), memo.get("health"), *(memo.get("knative") or ())]
    for task in tasks:
        if isinstance(task, asyncio.Task):
            await _stop_task(task)
    session = memo.get("health_session")
    if isinstance(session, aiohttp.ClientSession):
        await session.close()
    runtime = memo.get("runtime")
    if isinstance(runtime, Runtime):
        await runtime.kube.close()


@kopf.index(*REGISTRIES, id=MEMBERSHIP_INDEX)
def registries_by_member(*, name: str, body: kopf.Body, **_: Any) -> dict[tuple[str, str], str]:
    return registry.index_entries(name, body)


@kopf.on.resume(*AGENTS)
@kopf.on.create(*AGENTS)
@kopf.on.update(*AGENTS)
async def agent_deployment(
    *, namespace: str | None, name: str, memo: Any, logger: Logger, retry: int, **kwargs: Any
) -> None:
    assert namespace is not None  # a namespaced kind
    try:
        await reconcile.reconcile_agent(_runtime(memo), namespace, name, _index(kwargs), logger)
    except ReconcileError as exc:
        raise _retry(exc, retry) from exc


# Knative Services are watched by knative_watch.py (they may be installed while the operator runs).
@kopf.on.event("apps", "v1", "deployments", labels=OWNED)
async def workload(*, type: str | None, body: kopf.Body, memo: Any, logger: Logger, **kwargs: Any) -> None:
    # Event handlers are not retried by kopf: the next status change of the workload brings a fresh try.
    try:
        await reconcile.workload_changed(_runtime(memo), type, body, _index(kwargs), logger)
    except ReconcileError as exc:
        logger.warning("%s", exc)


@kopf.on.resume(*REGISTRIES)
@kopf.on.create(*REGISTRIES)
@kopf.on.update(*REGISTRIES)
async def agent_registry(*, body: kopf.Body, memo: Any, logger: Logger, retry: int, **kwargs: Any) -> None:
    try:
        await reconcile.registry_changed(_runtime(memo), body, _index(kwargs), logger, deleted=False)
    except ReconcileError as exc:
        raise _retry(exc, retry) from exc


@kopf.on.event(*REGISTRIES, when=lambda type, **_: type == "DELETED")
async def agent_registry_deleted(*, body: kopf.Body, memo: Any, logger: Logger, **kwargs: Any) -> None:
    for attempt in range(1, DELETION_ATTEMPTS + 1):
        try:
            await reconcile.registry_changed(_runtime(memo), body, _index(kwargs), logger, deleted=True)
            return
        except ReconcileError as exc:
            if not exc.retriable or attempt == DELETION_ATTEMPTS:
                logger.error("re-wiring the members of a deleted AgentRegistry failed: %s", exc)
                return
            await asyncio.sleep(RETRY_DELAY)
