"""Issue #19, step 5's first half: the chart's NetworkPolicies are enforced (kube-router's firewall
controller, a host process of the e2e cluster). Only agent pods reach the proxy; nothing but the proxy
reaches Valkey. A pod labelled as an agent is the positive control: it differs from the outsider only
by that label, and it does reach the proxy."""

from __future__ import annotations

import json
import textwrap

import pytest

from sessionmem_core import kube
from tests.e2e.conftest import E2ECluster, Release, finished_phase, release_workloads

pytestmark = pytest.mark.e2e

# Connects to each target; with a name to wait for, first retries that one until it connects (kube-router
# adds a new pod's address to the allowed sets a moment after the pod starts). Prints one JSON line.
PROBE = textwrap.dedent(
    """
    import json, socket, sys, time
    targets, wait_for = json.loads(sys.argv[1]), sys.argv[2]

    def reach(host, port):
        try:
            with socket.create_connection((host, port), timeout=3):
                return "connected"
        except TimeoutError:
            return "dropped"
        except ConnectionRefusedError:
            return "refused"  # kube-router REJECTs what no policy allows
        except OSError as exc:
            return type(exc).__name__

    if wait_for:
        deadline = time.monotonic() + 60
        while reach(*targets[wait_for]) != "connected" and time.monotonic() < deadline:
            time.sleep(1)
    print(json.dumps({name: reach(host, port) for name, (host, port) in targets.items()}))
    """
)


def _probe(
    cluster: E2ECluster, namespace: str, name: str, labels: dict[str, str], targets: str, wait_for: str
) -> dict[str, str]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "probe",
                    "image": cluster.image,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", PROBE, targets, wait_for],
                }
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    phase = finished_phase(cluster, namespace, name, timeout=150.0)
    logs = cluster.kubectl("logs", name, "-n", namespace)
    assert phase == "Succeeded", logs
    result: dict[str, str] = json.loads(logs.strip().splitlines()[-1])
    return result


def test_only_agents_reach_the_proxy_and_only_the_proxy_reaches_valkey(
    e2e_cluster: E2ECluster, release: Release, namespace: str
) -> None:
    workloads = release_workloads(e2e_cluster, release)
    domain = f"{release.namespace}.svc.cluster.local"
    targets = json.dumps(
        {
            "proxy": [f"{workloads['proxy'].split('/', 1)[1]}.{domain}", 8000],
            "valkey": [f"{workloads['valkey'].split('/', 1)[1]}.{domain}", 6379],
        }
    )

    agent_like = _probe(e2e_cluster, namespace, "agent-like", {kube.LABEL_AGENT: "probe"}, targets, "proxy")
    outsider = _probe(e2e_cluster, namespace, "outsider", {}, targets, "")

    assert agent_like["proxy"] == "connected", agent_like
    assert agent_like["valkey"] != "connected", agent_like
    assert outsider["proxy"] != "connected" and outsider["valkey"] != "connected", outsider
