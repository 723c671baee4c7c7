"""How the proxy and the launcher configure granian (Rust/hyper) from their serving limits, alike."""

from __future__ import annotations

from granian.http import HTTP1Settings

from sessionmem_core.env import ServingLimits

# hyper's smallest read buffer; a head must fit in the buffer, so it is also the smallest header limit.
MIN_READ_BUFFER = 8192


def http1_settings(limits: ServingLimits) -> HTTP1Settings:
    """hyper has one timer for "waiting for a request head", started on a new connection and after each
    answer: it bounds a trickled head (slowloris) and an idle keep-alive connection alike, so it is the
    stricter of the two limits. The whole head must fit in the read buffer: over it, hyper answers 431."""
    wait = min(limits.header_timeout_seconds, limits.idle_timeout_seconds)
    return HTTP1Settings(
        header_read_timeout=max(1, round(wait * 1000)),
        keep_alive=True,
        max_buffer_size=max(MIN_READ_BUFFER, limits.max_header_bytes),
    )


def open_connections(limits: ServingLimits) -> int:
    """granian's cap on requests it hands the app (its ``backpressure``; further ones wait in the listen
    backlog). Twice the requests allowed in flight, so a request over that limit still reaches the app
    and gets its typed 503 instead of waiting unanswered."""
    return 2 * limits.max_connections
