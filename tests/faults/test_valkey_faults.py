"""Valkey SIGKILLed and restarted (and paused) under a mixed load through the real proxy process:
callers see typed 503s during the gap and nothing else, the proxy recovers on its own within 2 s of Valkey
being back, and with ``appendfsync always`` no acknowledged append is lost."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tests.faults.load import LoadResult, MixedLoad, lost_acknowledged
from tests.faults.stack import AOF_ALWAYS, AUTH, LOAD_CAP, Stack, running_stack

CLIENTS = 8
LOAD_SECONDS = 6.0
MAX_OPS = 30_000
# Enough acknowledged appends for "none lost" to mean something; the load runs on until it has them.
MIN_ACKED = 200
RECOVERY_BUDGET_SECONDS = 2.0
ALLOWED_DURING_GAP = {"503:backend_unavailable"}


def _load(stack: Stack, prefix: str) -> MixedLoad:
    return MixedLoad(
        stack.proxy.base_url, headers=AUTH, clients=CLIENTS, conversations=32, prefix=prefix, query={"cap": LOAD_CAP}
    )


async def _with_fault(load: MixedLoad, fault_at: float, fault: Callable[[], float]) -> tuple[LoadResult, float]:
    running = asyncio.create_task(load.run(LOAD_SECONDS, MAX_OPS, min_acked=MIN_ACKED))
    await asyncio.sleep(fault_at)
    t_back = await asyncio.to_thread(fault)
    result = await running
    return result, t_back


def _report(name: str, result: LoadResult, t_back: float) -> str:
    recovery = result.recovery_after(t_back)
    return (
        f"{name}: {len(result.outcomes)} ops in {result.seconds:.1f}s ({result.ok_rate():.0f} ok/s), "
        f"classes {dict(result.by_class())}, acked appends {result.acked_count()}, "
        f"first ok {recovery.first_ok}, last failure {recovery.last_failure} s after back"
    )


async def test_valkey_sigkill_restart_under_load_typed_503s_recovery_and_no_acked_loss() -> None:
    with running_stack(AOF_ALWAYS) as stack:
        load = _load(stack, "kill")
        result, t_back = await _with_fault(load, 1.5, lambda: stack.kill_valkey_and_restart(1.5))
        print(_report("valkey SIGKILL", result, t_back))

        failures = result.failures()
        assert failures, "the kill should have been seen by the load"
        assert set(failures) <= ALLOWED_DURING_GAP, failures
        assert not any(o.outcome.startswith("5") and o.outcome != "503:backend_unavailable" for o in result.outcomes)
        recovery = result.recovery_after(t_back)
        assert recovery.first_ok is not None and recovery.after > 0
        assert (recovery.seconds or 0.0) < RECOVERY_BUDGET_SECONDS, recovery
        # The proxy itself was never restarted.
        assert stack.proxy._proc is not None and stack.proxy._proc.poll() is None

        lost = lost_acknowledged(result.acked, stack.read_all)
        assert result.acked_count() >= MIN_ACKED
        assert lost == {}, f"{sum(map(len, lost.values()))} acknowledged appends lost: {lost}"


async def test_valkey_paused_under_load_times_out_typed_then_recovers() -> None:
    """SIGSTOP: connections stay open but nothing answers; the proxy's bounded timeout turns it into 503s."""
    with running_stack(AOF_ALWAYS) as stack:
        load = _load(stack, "pause")
        result, t_back = await _with_fault(load, 1.5, lambda: stack.pause_valkey(2.0))
        print(_report("valkey SIGSTOP", result, t_back))

        assert set(result.failures()) <= ALLOWED_DURING_GAP, result.failures()
        assert result.failures(), "the pause should have been seen by the load"
        recovery = result.recovery_after(t_back)
        assert (recovery.seconds or 0.0) < RECOVERY_BUDGET_SECONDS, recovery
        assert lost_acknowledged(result.acked, stack.read_all) == {}
