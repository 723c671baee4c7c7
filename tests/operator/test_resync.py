"""The operator-wide resync task outlives whatever one round or one agent throws at it, and the operator
still stops. Found on a slow machine: a resync that reached an agent whose namespace was being deleted
posted a Warning from outside kopf's per-object tasks, the LookupError killed the task (no more drift
repair), and the cleanup re-raised it every 5 s, so the operator never stopped."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest

from sessionmem_operator import handlers, reconcile
from sessionmem_operator.config import MIN_RESYNC_SECONDS, OperatorConfig
from sessionmem_operator.kubeapi import KubeApi
from sessionmem_operator.reconcile import Runtime, resync_all
from tests.operator.test_reconcile import LOG, FakeKube, Warnings, stored_agent

AGENT = {"apiVersion": "agents.ctxmesh.ai/v1beta1", "kind": "AgentDeployment"}


def test_a_warning_outside_kopfs_object_tasks_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    body = {**AGENT, "metadata": {"name": "support-agent", "namespace": "my-team", "uid": "u-1"}}
    with caplog.at_level(logging.WARNING, logger="sessionmem.operator"):
        handlers._post_warning(body, "KnativeMissing", "Knative Serving is not installed")
    assert any("KnativeMissing" in r.getMessage() and "support-agent" in r.getMessage() for r in caplog.records)


async def test_one_agents_unexpected_failure_does_not_stop_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeKube()
    stored_agent(fake)
    other = dict(fake.objects[next(iter(fake.objects))])
    other["metadata"] = {**other["metadata"], "name": "broken-agent", "uid": "u-broken"}
    fake.put(other)
    runtime = Runtime(
        config=OperatorConfig(proxy_url="http://proxy:8000"), kube=cast(KubeApi, fake), post_warning=Warnings()
    )
    real = reconcile.reconcile_agent
    reached: list[str] = []

    async def reconcile_or_break(rt: Runtime, namespace: str, name: str, index: Any, logger: Any) -> None:
        reached.append(name)
        if name == "broken-agent":
            raise LookupError("as kopf.warn raises outside its object tasks")
        await real(rt, namespace, name, index, logger)

    monkeypatch.setattr(reconcile, "reconcile_agent", reconcile_or_break)
    assert await resync_all(runtime, {}, LOG) == 1
    assert sorted(reached) == ["broken-agent", "support-agent"]


async def test_the_resync_loop_survives_a_failed_round(monkeypatch: pytest.MonkeyPatch) -> None:
    rounds: list[int] = []
    two_rounds = asyncio.Event()

    async def flaky_round(runtime: Runtime, index: Any, logger: Any) -> int:
        rounds.append(len(rounds))
        if len(rounds) == 1:
            raise RuntimeError("the first round breaks")
        two_rounds.set()
        return 0

    monkeypatch.setattr(reconcile, "resync_all", flaky_round)
    config = OperatorConfig(proxy_url="http://proxy:8000", resync_seconds=MIN_RESYNC_SECONDS)
    runtime = Runtime(config=config, kube=cast(KubeApi, FakeKube()), post_warning=Warnings())
    task = asyncio.create_task(handlers._resync_forever(runtime, cast(handlers.Index, {}), LOG))
    try:
        # A hang guard, not a speed target: the second round follows the first by resync_seconds.
        await asyncio.wait_for(two_rounds.wait(), timeout=60)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert len(rounds) >= 2


async def test_cleanup_finishes_whatever_ended_the_resync_task() -> None:
    async def died() -> None:
        raise LookupError("the task ended with an error")

    task = asyncio.create_task(died())
    await asyncio.gather(task, return_exceptions=True)
    await handlers._stop_task(task)
    assert task.done()
