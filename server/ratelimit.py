"""Per-principal rate limits: a token bucket per (tenant, principal), from the serve config."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class RateLimiter:
    """``rate`` calls per second sustained, ``burst`` at once; ``rate`` 0 turns it off."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self.clock = clock
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}  # key -> (tokens, at)
        self._lock = threading.Lock()

    def allow(self, tenant: str, principal: str) -> bool:
        if self.rate <= 0:
            return True
        now = self.clock()
        key = (tenant, principal)
        with self._lock:
            tokens, at = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                return False
            self._buckets[key] = (tokens - 1.0, now)
            if len(self._buckets) > 65_536:  # principals idle long enough are full again: drop them
                horizon = self.burst / self.rate
                self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < horizon}
            return True
