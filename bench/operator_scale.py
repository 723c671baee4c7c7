"""Operator scale check: N AgentDeployments applied at once against the test harness's real API server.

Starts a control plane (tests/harness), runs the operator as a subprocess (``python -m sessionmem_operator``,
so its resident memory can be read from /proc), creates N AgentDeployments concurrently and watches for
their Knative Services and their status. Prints, per agent, the latency from the create request to

- the rendered workload (the Knative Service exists), and
- the recorded status (observedGeneration and MemoryReady written on the AgentDeployment),

as median / p90 / max, plus the operator's RSS before and after (and its peak).

    PYTHONPATH=core:operator:proxy:launcher:. .venv/bin/python bench/operator_scale.py [--count 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "core"), str(REPO / "operator")]

from sessionmem_core import env, kube  # noqa: E402
from tests.harness import KubeTestCluster, free_port, knative_crd_paths, repo_crd_paths  # noqa: E402

NAMESPACE = "bench"
KSVC_PATH = f"/apis/serving.knative.dev/v1/namespaces/{NAMESPACE}/services"
AGENTS_PATH = f"/apis/{kube.API_VERSION}/namespaces/{NAMESPACE}/{kube.AGENT_PLURAL}"


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB, from /proc."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


@contextmanager
def operator_process(cluster: KubeTestCluster, workdir: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    health_port = free_port()
    config_file = workdir / "operator.yaml"
    config_file.write_text(
        f"livenessEndpoint: http://127.0.0.1:{health_port}/healthz\nlogFormat: plain\n", encoding="utf-8"
    )
    environ = cluster.kubeconfig_env()
    environ["PYTHONPATH"] = os.pathsep.join(str(REPO / p) for p in ("core", "operator"))
    environ[env.OPERATOR_CONFIG_FILE] = str(config_file)
    environ[env.OPERATOR_PROXY_URL] = "http://sessionmem-proxy.sessionmem.svc:8000"
    log_path = workdir / "operator.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sessionmem_operator"], env=environ, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the operator exited: {log_path.read_text()[-3000:]}")
                try:
                    if httpx.get(f"http://127.0.0.1:{health_port}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the operator did not become healthy in 30 s")
                time.sleep(0.1)
            yield proc, log_path
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def agent_manifest(name: str) -> dict[str, Any]:
    return {
        "apiVersion": kube.API_VERSION,
        "kind": kube.AGENT_KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"image": "ghcr.io/my-org/support-agent:1.4.0", "sessionMemory": {"scope": "session"}},
    }


async def watch(
    http: httpx.AsyncClient, path: str, seen: dict[str, float], accept: Any, done: asyncio.Event, expected: int
) -> None:
    params = {"watch": "true", "allowWatchBookmarks": "false"}
    async with http.stream("GET", path, params=params, timeout=None) as response:
        async for line in response.aiter_lines():
            if not line:
                continue
            event = json.loads(line)
            obj = event.get("object") or {}
            name = (obj.get("metadata") or {}).get("name")
            if name and name not in seen and accept(obj):
                seen[name] = time.monotonic()
                if len(seen) >= expected:
                    done.set()
                    return


def status_recorded(obj: dict[str, Any]) -> bool:
    status = obj.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    return (
        status.get("observedGeneration") == obj["metadata"].get("generation")
        and conditions.get("MemoryReady") == "True"
    )


async def run_burst(cluster: KubeTestCluster, count: int, timeout: float) -> tuple[list[float], list[float], float]:
    context = ssl.create_default_context(cafile=str(cluster.ca_path))
    headers = {"Authorization": f"Bearer {cluster.admin_token}"}
    limits = httpx.Limits(max_connections=count + 8)
    async with httpx.AsyncClient(base_url=cluster.server_url, verify=context, headers=headers, limits=limits) as http:
        workloads: dict[str, float] = {}
        statuses: dict[str, float] = {}
        workloads_done, statuses_done = asyncio.Event(), asyncio.Event()
        watchers = [
            asyncio.create_task(watch(http, KSVC_PATH, workloads, lambda _: True, workloads_done, count)),
            asyncio.create_task(watch(http, AGENTS_PATH, statuses, status_recorded, statuses_done, count)),
        ]
        await asyncio.sleep(0.5)  # let both watches open before the burst
        sent: dict[str, float] = {}

        async def create(name: str) -> None:
            sent[name] = time.monotonic()
            response = await http.post(AGENTS_PATH, json=agent_manifest(name))
            response.raise_for_status()

        started = time.monotonic()
        await asyncio.gather(*(create(f"agent-{i:03d}") for i in range(count)))
        try:
            await asyncio.wait_for(asyncio.gather(workloads_done.wait(), statuses_done.wait()), timeout)
        finally:
            for task in watchers:
                task.cancel()
        total = time.monotonic() - started
    to_workload = [workloads[name] - sent[name] for name in sent]
    to_status = [statuses[name] - sent[name] for name in sent]
    return to_workload, to_status, total


def summary(label: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (
        f"{label:<28} median {statistics.median(ordered) * 1000:7.0f} ms   p90 {p90 * 1000:7.0f} ms   "
        f"max {ordered[-1] * 1000:7.0f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=50, help="AgentDeployments created at once (default 50)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for all of them")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="sessionmem-bench-") as tmp:
        cluster = KubeTestCluster(crd_paths=[*knative_crd_paths(), *repo_crd_paths()])
        cluster.start()
        try:
            cluster.create_namespace(NAMESPACE)
            with operator_process(cluster, Path(tmp)) as (proc, log_path):
                time.sleep(1.0)  # let the initial listings settle before sampling memory
                idle_rss, _ = rss_kib(proc.pid)
                to_workload, to_status, total = asyncio.run(run_burst(cluster, args.count, args.timeout))
                time.sleep(1.0)  # trailing workload events
                busy_rss, peak_rss = rss_kib(proc.pid)
                errors = [ln for ln in log_path.read_text().splitlines() if "ERROR" in ln]
        finally:
            cluster.stop()

    print(f"operator scale: {args.count} AgentDeployments created at once (Knative Services, session memory)")
    print(summary("apply -> workload rendered", to_workload))
    print(summary("apply -> status recorded", to_status))
    print(f"{'all done in':<28} {total:.2f} s")
    mib = {"idle": idle_rss / 1024, "after": busy_rss / 1024, "peak": peak_rss / 1024}
    print(f"{'operator RSS':<28} " + ", ".join(f"{label} {value:.1f} MiB" for label, value in mib.items()))
    print(f"{'operator errors logged':<28} {len(errors)}")
    for line in errors[:5]:
        print("   ", line[:300])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
