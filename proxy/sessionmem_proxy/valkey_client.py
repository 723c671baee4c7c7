"""Making the Valkey client the store runs on: a standalone server, or a Valkey Cluster.

The URL picks the kind, nothing else changes (one key per conversation, so every store operation is a
single-slot command or script):

- ``valkey://host:port/0``, ``redis://...``, ``valkeys://...``/``rediss://...`` (TLS), ``unix://...``: one
  server (or a replicated primary), through the proxy's pipelining client (``sessionmem_proxy.resp_client``:
  concurrent requests share a few connections, reads apart from writes; every command has its own
  deadline, so a slow or timed-out command fails only its own request).
- ``valkey+cluster://host:port[,host:port...]`` (``valkeys+cluster://`` for TLS): a Valkey Cluster; the
  listed nodes are only seeds, the client discovers the slot map and follows MOVED/ASK and failovers.

Lua scripts work on both: ``register_script`` + EVALSHA routes by the script's one key, and a NOSCRIPT
(a promoted replica, a restarted node) is answered by loading the script on the primaries and retrying.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from valkey.asyncio.cluster import ClusterNode, ValkeyCluster

from sessionmem_proxy.resp_client import DEFAULT_CONNECTIONS, PipelinedValkey

CLUSTER_SCHEMES = {"valkey+cluster": "valkey", "valkeys+cluster": "valkeys", "redis+cluster": "redis"}

# A cluster-wide SCAN cursor packs (node cursor, node index): the node's own cursor shifted left by this
# many bits, the index of the primary (ordered by the first slot it serves) in the low bits.
_NODE_BITS = 10
_NODE_MASK = (1 << _NODE_BITS) - 1


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme.lower() in CLUSTER_SCHEMES


CLUSTER_CONNECTIONS_PER_NODE = 256


def connect(
    url: str, timeout_seconds: float, max_connections: int | None = None
) -> PipelinedValkey | SessionmemCluster:
    """A client with bounded timeouts (connect, and every command), so an unreachable or saturated Valkey
    turns into a 503, never a hang.

    For a ``valkey+cluster://`` URL this is a :class:`SessionmemCluster` (a ValkeyCluster, pooled up to
    ``max_connections`` per node); otherwise a :class:`PipelinedValkey` with up to ``max_connections``
    connections for reads and as many for writes. The store uses only what both offer
    (``store.ValkeyLike``), and both close with ``aclose()``. Nothing is retried: a timed-out append may
    have been applied, and only the caller (with its message ids) can retry it safely."""
    if is_cluster_url(url):
        return connect_cluster(url, timeout_seconds, max_connections or CLUSTER_CONNECTIONS_PER_NODE)
    return PipelinedValkey.from_url(url, timeout_seconds, max_connections or DEFAULT_CONNECTIONS)


def cluster_seeds(url: str) -> tuple[str, list[tuple[str, int]]]:
    """(the plain scheme, the seed nodes) of a cluster URL; raises ValueError when it names none."""
    parts = urlsplit(url)
    scheme = CLUSTER_SCHEMES.get(parts.scheme.lower())
    if scheme is None:
        raise ValueError(f"{parts.scheme}:// is not a cluster URL scheme")
    hostinfo = parts.netloc.rpartition("@")[2]
    seeds: list[tuple[str, int]] = []
    for item in hostinfo.split(","):
        item = item.strip()
        if not item:
            continue
        host, _, port = item.rpartition(":") if not item.endswith("]") else (item, "", "")
        if not host:
            host, port = item, ""
        seeds.append((host.strip("[]"), int(port) if port else 6379))
    if not seeds:
        raise ValueError(f"cluster URL {url!r} names no node")
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError("a Valkey Cluster has only database 0")
    return scheme, seeds


def connect_cluster(
    url: str, timeout_seconds: float, max_connections: int = CLUSTER_CONNECTIONS_PER_NODE
) -> SessionmemCluster:
    scheme, seeds = cluster_seeds(url)
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    first_host, first_port = seeds[0]
    # valkey-py parses credentials and query options (?ssl_cert_reqs=...) from a plain one-node URL.
    plain = urlunsplit((scheme, f"{userinfo + '@' if userinfo else ''}{first_host}:{first_port}", "", parts.query, ""))
    cluster = SessionmemCluster.from_url(
        plain,
        startup_nodes=[ClusterNode(host, port) for host, port in seeds],
        socket_timeout=timeout_seconds,
        socket_connect_timeout=timeout_seconds,
        max_connections=max_connections,
        health_check_interval=0,
        decode_responses=False,
        # A failover takes cluster-node-timeout plus an election: keep retrying through it, briefly, and
        # let the caller answer 503 meanwhile rather than holding the request for long.
        cluster_error_retry_attempts=3,
        require_full_coverage=False,
    )
    assert isinstance(cluster, SessionmemCluster)
    return cluster


class SessionmemCluster(ValkeyCluster):
    """ValkeyCluster whose ``scan`` keeps the standalone shape ``(cursor, keys)``: one integer cursor walks
    every primary in turn, so the store's paginated listing works unchanged on a cluster."""

    async def _primaries_in_slot_order(self) -> list[ClusterNode]:
        """The primaries, ordered by the first slot each serves: a failover keeps a shard's place (its
        promoted replica serves the same slots), so a cursor keeps naming the same shard. From the
        cluster's own ``CLUSTER SLOTS`` (one call per page of a listing, never on an operation's path)."""
        slots: dict[tuple[int, int], dict[str, Any]] = await self.cluster_slots()
        primaries: list[ClusterNode] = []
        for _range, served in sorted(slots.items()):
            host, port = served["primary"]
            node = self.get_node(host=host, port=int(port))
            if node is not None and node not in primaries:
                primaries.append(node)
        return primaries

    async def scan(
        self,
        cursor: int = 0,
        match: Any = None,
        count: int | None = None,
        _type: str | None = None,
        **kwargs: Any,
    ) -> tuple[int, list[bytes]]:
        await self.initialize()  # at once when it already is
        primaries = await self._primaries_in_slot_order()
        index, node_cursor = cursor & _NODE_MASK, cursor >> _NODE_BITS
        if not primaries or index >= len(primaries):
            return 0, []
        cursors, keys = await super().scan(
            cursor=node_cursor, match=match, count=count, _type=_type, target_nodes=primaries[index], **kwargs
        )
        next_node_cursor = int(next(iter(cursors.values()), 0))
        if next_node_cursor:
            return (next_node_cursor << _NODE_BITS) | index, list(keys)
        if index + 1 < len(primaries):
            return index + 1, list(keys)  # the next primary, from its start
        return 0, list(keys)

    async def scan_iter(
        self, match: Any = None, count: int | None = None, _type: str | None = None, **kwargs: Any
    ) -> Any:
        cursor = 0
        while True:
            cursor, keys = await self.scan(cursor, match=match, count=count, _type=_type, **kwargs)
            for key in keys:
                yield key
            if cursor == 0:
                return
