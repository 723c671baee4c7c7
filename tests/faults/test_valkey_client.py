"""``connect()``: the URL picks standalone or cluster; the standalone path is unchanged."""

from __future__ import annotations

import pytest
import valkey.asyncio as valkey_async

from sessionmem_core.valkey_client import SessionmemCluster, cluster_seeds, connect, is_cluster_url


def test_standalone_urls_make_the_standalone_client() -> None:
    client = connect("valkey://127.0.0.1:6379/0", 1.0)
    assert type(client) is valkey_async.Valkey
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 1.0 and kwargs["socket_connect_timeout"] == 1.0
    assert not is_cluster_url("valkey://h:1/0") and not is_cluster_url("unix:///tmp/v.sock")


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
