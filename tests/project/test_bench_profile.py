"""bench.profile's attribution of py-spy samples: a granian worker's serving thread has no
``_run_module_as_main`` root (granian calls the app from Rust), and the worker's start-up stack as the
deepest frame is the event loop's own time, not our code's."""

from __future__ import annotations

from pathlib import Path

from bench.profile import LOOP_ITSELF, attribute

START_UP = ";".join(
    [
        "_run_module_as_main (<frozen runpy>:198)",
        "main (sessionmem_proxy/__main__.py:20)",
        "serve (sessionmem_proxy/server.py:48)",
        "MPServer._spawn_rsgi_worker (granian/server/mp.py:150)",
    ]
)
CALLBACK = "ProxyApp.__rsgi__ (sessionmem_proxy/app.py:76)"
EXPORTER = "_bootstrap (threading.py:1002);_bootstrap_inner (threading.py:1045);run (threading.py:982)"


def test_serving_thread_samples_are_split_by_layer_and_other_threads_left_out(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(
        "\n".join(
            [
                f"{START_UP} 50",  # the loop itself, in C
                f"{START_UP};ProxyApp._serve (sessionmem_proxy/app.py:120) 30",  # a task the loop runs
                f"{CALLBACK} 20",  # called from Rust: no runpy root
                f"{EXPORTER} 40",  # another thread
            ]
        )
    )

    profile = attribute(raw)

    assert profile["main_thread_samples"] == 100
    assert profile["other_thread_samples"] == 40
    assert profile["layers"] == {LOOP_ITSELF: 0.5, "sessionmem code: sessionmem_proxy/app.py": 0.5}
    assert profile["top_self"][0] == ("MPServer._spawn_rsgi_worker (granian/server/mp.py)", 0.5)
