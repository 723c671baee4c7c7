"""The token bucket the proxy counts every rate with: an agent's requests and transfer (``quotas``), the
API calls for unknown tokens (``tokenreview``) and for administrators (``admin``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``per_second`` on average, ``burst`` at once."""

    per_second: float
    burst: int


@dataclass(slots=True)
class TokenBucket:
    """``tokens`` as of ``at`` (a monotonic clock's seconds); it refills at a rate up to a burst, which
    the caller passes on each look (an agent's limits may change between two). A charge may put it in
    debt (negative tokens)."""

    tokens: float
    at: float

    def refill(self, now: float, rate: float, burst: float) -> float:
        """The tokens at ``now``: what came back since the last look, up to ``burst``."""
        self.tokens = min(burst, self.tokens + (now - self.at) * rate)
        self.at = now
        return self.tokens

    def take(self, now: float, rate: float, burst: float) -> float:
        """Takes one token and answers 0, or takes nothing and answers the seconds until one is back."""
        if self.refill(now, rate, burst) < 1.0:
            return (1.0 - self.tokens) / rate
        self.tokens -= 1.0
        return 0.0
