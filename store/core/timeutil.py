"""Clock and canonical instants (epoch milliseconds <-> YYYY-MM-DDTHH:mm:ss.sssZ)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
Clock = Callable[[], int]


def wall_clock() -> int:
    return time.time_ns() // 1_000_000


def default_clock(shared: Callable[[], int | None] | None = None) -> Clock:
    """The wall clock, or a frozen one for reproducibility runs (ENGRAM_CLOCK_MS, test-only); on a
    store shared by several nodes, ``shared`` (the store's clock: store/postgres/backend.py)."""
    fixed = os.environ.get("ENGRAM_CLOCK_MS")
    if fixed:
        value = int(fixed)
        return lambda: value
    if shared is not None and shared() is not None:
        store_clock = shared

        def clock() -> int:
            now = store_clock()
            return wall_clock() if now is None else now

        return clock
    return wall_clock


def to_instant(ms: int) -> str:
    dt = EPOCH + timedelta(milliseconds=ms)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def from_instant(text: str) -> int:
    dt = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    delta = dt - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
