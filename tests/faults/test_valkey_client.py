"""``connect()``: the URL picks standalone (the pipelining client) or cluster (valkey-py's cluster client)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import valkey
from valkey.exceptions import ConnectionError as ValkeyConnectionError
from valkey.exceptions import TimeoutError as ValkeyTimeoutError

from sessionmem_proxy.valkey_client import SessionmemCluster, cluster_seeds, connect, is_cluster_url
from tests.support.valkey import ValkeyProcess, free_port


async def test_standalone_urls_make_a_client_with_bounded_timeouts(valkey_server: ValkeyProcess) -> None:
    for scheme in ("valkey", "redis"):
        client = connect(f"{scheme}://127.0.0.1:{valkey_server.port}/0", 0.3)
        try:
            assert await client.ping() is True
            # The per-command timeout is the one given: a paused server is a TimeoutError within it, and the
            # client answers again once the server does.
            admin: Any = valkey.Valkey(host="127.0.0.1", port=valkey_server.port)  # its execute_command is untyped
            admin.execute_command("CLIENT", "PAUSE", 800, "ALL")
            started = time.monotonic()
            with pytest.raises(ValkeyTimeoutError):
                await client.ping()
            assert time.monotonic() - started < 0.8
            await asyncio.sleep(0.9)
            assert await client.ping() is True
        finally:
            await client.aclose()
    assert not is_cluster_url("valkey://h:1/0") and not is_cluster_url("unix:///tmp/v.sock")


async def test_an_unreachable_standalone_server_is_a_connection_error_at_once() -> None:
    for url in (f"valkey://127.0.0.1:{free_port()}/0", "unix:///nonexistent/valkey.sock"):
        client = connect(url, 1.0)
        started = time.monotonic()
        with pytest.raises(ValkeyConnectionError):
            await client.ping()
        assert time.monotonic() - started < 1.0
        await client.aclose()


@pytest.mark.parametrize(
    ("url", "scheme", "seeds"),
    [
        ("valkey+cluster://10.0.0.1:7000", "valkey", [("10.0.0.1", 7000)]),
        ("valkey+cluster://a:7000,b:7001,c", "valkey", [("a", 7000), ("b", 7001), ("c", 6379)]),
        ("valkeys+cluster://user:pw@a:7000/0", "valkeys", [("a", 7000)]),
        ("VALKEY+CLUSTER://[::1]:7000", "valkey", [("::1", 7000)]),
    ],
)
def test_cluster_urls_name_their_seeds(url: str, scheme: str, seeds: list[tuple[str, int]]) -> None:
    assert is_cluster_url(url)
    assert cluster_seeds(url) == (scheme, seeds)


@pytest.mark.parametrize("url", ["valkey+cluster://", "valkey+cluster://a:7000/3", "valkey://a:1/0"])
def test_bad_cluster_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        cluster_seeds(url)


def test_cluster_url_makes_a_cluster_client_with_the_timeouts() -> None:
    client = connect("valkey+cluster://127.0.0.1:7000,127.0.0.1:7001", 0.5)
    assert isinstance(client, SessionmemCluster)
    assert [n.port for n in client.nodes_manager.startup_nodes.values()] == [7000, 7001]
    assert client.connection_kwargs["socket_timeout"] == 0.5
