"""The proxy SIGKILLed and restarted under load behind the launcher (all real processes): the managed loop
answers every turn (fail-open: 200 with ``X-Sessionmem-Memory: unavailable`` while the proxy is down), no
error reaches the caller, and memory resumes once the proxy is back, without touching the launcher."""

from __future__ import annotations

import asyncio

import httpx
import orjson

from sessionmem_core import api
from tests.faults.load import MixedLoad, Outcome, lost_acknowledged
from tests.faults.stack import AOF_ALWAYS, running_stack

CLIENTS = 8
LOAD_SECONDS = 7.0
MAX_OPS = 20_000
RECOVERY_BUDGET_SECONDS = 2.0


def _memory_ok(outcome: Outcome) -> bool:
    return outcome.ok and outcome.memory == "ok"


async def test_proxy_sigkill_restart_behind_the_launcher_fails_open_and_resumes() -> None:
    with running_stack(AOF_ALWAYS, with_launcher=True) as stack:
        assert stack.launcher is not None
        launcher_pid = stack.launcher.pid
        turns = MixedLoad(stack.launcher.base_url, clients=CLIENTS, conversations=16, prefix="turns", turns=True)
        running = asyncio.create_task(turns.run(LOAD_SECONDS, MAX_OPS))
        await asyncio.sleep(1.5)
        t_back = await asyncio.to_thread(stack.kill_proxy_and_restart, 2.0)
        result = await running

        recovery = result.recovery_after(t_back, ok=_memory_ok)
        print(
            f"proxy SIGKILL behind launcher: {len(result.outcomes)} turns in {result.seconds:.1f}s, "
            f"classes {dict(result.by_class())}, memory {dict(result.memory_states())}, "
            f"memory ok again {recovery.first_ok} s after the proxy was back, last degraded {recovery.last_failure}"
        )
        # Every turn answered by the agent: no error class at all reached the caller.
        assert result.failures() == {}, result.failures()
        states = result.memory_states()
        assert states["unavailable"] > 0, "the outage should have been seen"
        assert set(states) <= {"ok", "unavailable", "not-stored"}, states
        assert (recovery.seconds or 0.0) < RECOVERY_BUDGET_SECONDS, recovery
        assert stack.launcher.pid == launcher_pid  # never restarted
        # Every turn that said "memory: ok" really is stored (its user input is in Valkey).
        assert sum(map(len, result.acked_turns.values())) > 100
        assert lost_acknowledged({}, stack.read_all, result.acked_turns) == {}

        # Memory really resumed: a turn now is replayed the earlier history, through the same launcher.
        async with httpx.AsyncClient(base_url=stack.launcher.base_url, timeout=5) as http:
            first = await http.post(
                "/", json={"input": "my name is Ada"}, headers={api.CONVERSATION_ID_HEADER: "after-fault"}
            )
            second = await http.post(
                "/", json={"input": "what is my name?"}, headers={api.CONVERSATION_ID_HEADER: "after-fault"}
            )
        assert first.headers[api.MEMORY_STATUS_HEADER] == "ok"
        assert second.headers[api.MEMORY_STATUS_HEADER] == "ok"
        assert orjson.loads(second.content)["output"] == "Your name is Ada."


async def test_memory_endpoint_answers_typed_503_while_the_proxy_is_down() -> None:
    """The launcher's own memory endpoint (what agents call directly): typed 503s, never a hang or a 500,
    and no acknowledged append lost across the proxy restart."""
    with running_stack(AOF_ALWAYS, with_launcher=True) as stack:
        load = MixedLoad(f"http://127.0.0.1:{stack.memory_port}", clients=CLIENTS, conversations=16, prefix="mem")
        running = asyncio.create_task(load.run(6.0, MAX_OPS))
        await asyncio.sleep(1.5)
        t_back = await asyncio.to_thread(stack.kill_proxy_and_restart, 1.5)
        result = await running
        recovery = result.recovery_after(t_back)
        print(f"memory endpoint, proxy SIGKILL: classes {dict(result.by_class())}, recovery {recovery}")
        assert result.failures(), "the outage should have been seen"
        assert set(result.failures()) <= {"503:backend_unavailable"}, result.failures()
        assert (recovery.seconds or 0.0) < RECOVERY_BUDGET_SECONDS, recovery
        assert lost_acknowledged(result.acked, stack.read_all) == {}
