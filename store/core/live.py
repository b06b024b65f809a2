"""Per-scope read state kept in step with the journal: which records are current, their
valid-time and expiry windows, the projection cursor, and a bounded cache of decrypted bodies.

A search checks eligibility of up to two thousand channel hits; a DuckDB round trip for that
cost more than both channels together. The writer (under the engine's write lock) keeps this
view exact: admission adds, forget and expiry remove, every mutation sets the cursor. A scope
is loaded from DuckDB on first use (and again after a rebuild or an aborted write).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from engram_memory.retrieval.rerank import Timeline

RECORD_CACHE_SIZE = 4096  # decrypted record bodies kept per engine (LRU)


@dataclass(frozen=True)
class Window:
    valid_t: int
    valid_t_end: int | None
    expires_at_ms: int | None
    event_at: int | None = None  # primary_event.at: the record's place in the scope's timeline
    turn: bool = False  # a conversation turn (primary_event.type_ref is a turn type): in the timeline

    @property
    def steady(self) -> bool:
        """Open-ended and never expiring: eligible at every instant from ``valid_t`` on."""
        return self.valid_t_end is None and self.expires_at_ms is None

    def eligible(self, valid_as_of: int, now: int) -> bool:
        """Current records only: inside valid_time at the read instant, not past expires_at."""
        return (
            self.valid_t <= valid_as_of
            and (self.valid_t_end is None or self.valid_t_end >= valid_as_of)
            and (self.expires_at_ms is None or self.expires_at_ms > now)
        )


@dataclass
class ScopeView:
    projection_cursor: int
    live: dict[str, Window] = field(default_factory=dict)
    timeline: Timeline = field(init=False)  # the live records in event order, kept with ``live``

    # Records with no end to their valid time and no expiry, and a bound on their valid_t: from that
    # instant on, they are eligible whatever the read instant, so a search's thousands of hits are
    # checked with one set intersection (and only the others window by window).
    steady: set[str] = field(init=False)
    steady_from: int = field(init=False)

    def __post_init__(self) -> None:
        self.timeline = Timeline({rid: w.event_at for rid, w in self.live.items()
                                  if w.turn and w.event_at is not None})
        self.steady = {rid for rid, w in self.live.items() if w.steady}
        self.steady_from = max((self.live[rid].valid_t for rid in self.steady), default=0)

    def put(self, record_id: str, window: Window) -> None:
        self.pop(record_id)
        self.live[record_id] = window
        if window.turn and window.event_at is not None:
            self.timeline.add(record_id, window.event_at)
        if window.steady:
            self.steady.add(record_id)
            self.steady_from = max(self.steady_from, window.valid_t)  # an upper bound: never lowered

    def pop(self, record_id: str) -> None:
        if self.live.pop(record_id, None) is not None:
            self.timeline.remove(record_id)
            self.steady.discard(record_id)

    def next_expiry(self) -> int | None:
        expiring = [w.expires_at_ms for w in self.live.values() if w.expires_at_ms is not None]
        return min(expiring) if expiring else None

    def eligible(self, record_ids: Iterable[str], valid_as_of: int, now: int) -> set[str]:
        live = self.live
        if valid_as_of < self.steady_from:  # a read pinned before some steady record began
            return {rid for rid in record_ids if (w := live.get(rid)) is not None and w.eligible(valid_as_of, now)}
        ids = record_ids if isinstance(record_ids, set | frozenset) else set(record_ids)
        out = self.steady & ids  # a set (the left operand's type)
        out.update(rid for rid in ids - out if (w := live.get(rid)) is not None and w.eligible(valid_as_of, now))
        return out


@dataclass
class ScopeViews:
    """The views of every scope used so far, plus the shared decrypted-record cache."""

    views: dict[str, ScopeView] = field(default_factory=dict)
    next_expiry: dict[str, int | None] = field(default_factory=dict)
    _records: OrderedDict[str, dict[str, Any]] = field(default_factory=OrderedDict)
    # Per record: its redacted packet core and the core's canonical bytes (store/core/reads.py).
    _cores: dict[str, tuple[dict[str, Any], bytes]] = field(default_factory=dict)
    # Per current record: its speaker labels (retrieval/rerank.py), kept past the body cache's LRU
    # so the rerank stage decrypts a head record once, not on every search that ranks it.
    _labels: dict[str, frozenset[str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, scope_ref: str) -> ScopeView | None:
        return self.views.get(scope_ref)

    def put(self, scope_ref: str, view: ScopeView) -> None:
        self.views[scope_ref] = view
        self.next_expiry[scope_ref] = view.next_expiry()

    def drop(self, scope_ref: str) -> None:
        self.views.pop(scope_ref, None)
        self.next_expiry.pop(scope_ref, None)

    def clear(self) -> None:
        self.views.clear()
        self.next_expiry.clear()
        with self._lock:
            self._records.clear()
            self._cores.clear()
            self._labels.clear()

    def expiry_due(self, scope_ref: str, now: int) -> bool:
        """True when some current record of a loaded scope has reached expires_at."""
        upcoming = self.next_expiry.get(scope_ref)
        return upcoming is not None and upcoming <= now

    # -- writer side (under the engine's write lock) ---------------------------------------

    def admitted(self, scope_ref: str, record_id: str, window: Window, cursor: int) -> None:
        view = self.views.get(scope_ref)
        if view is None:
            return  # not loaded yet: the first read loads it from DuckDB
        view.put(record_id, window)
        view.projection_cursor = cursor
        if window.expires_at_ms is not None:
            known = self.next_expiry.get(scope_ref)
            self.next_expiry[scope_ref] = window.expires_at_ms if known is None else min(known, window.expires_at_ms)

    def removed(self, scope_ref: str, record_ids: Iterable[str], cursor: int) -> None:
        ids = list(record_ids)
        with self._lock:
            for rid in ids:
                self._records.pop(rid, None)
                self._cores.pop(rid, None)
                self._labels.pop(rid, None)
        view = self.views.get(scope_ref)
        if view is None:
            return
        for rid in ids:
            view.pop(rid)
        view.projection_cursor = cursor
        self.next_expiry[scope_ref] = view.next_expiry()

    # -- decrypted bodies ------------------------------------------------------------------

    def cached(self, record_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        out = {}
        with self._lock:
            for rid in record_ids:
                record = self._records.get(rid)
                if record is not None:
                    self._records.move_to_end(rid)
                    out[rid] = record
        return out

    def remember(self, records: dict[str, dict[str, Any]]) -> None:
        with self._lock:
            for rid, record in records.items():
                self._records[rid] = record
                self._records.move_to_end(rid)
            while len(self._records) > RECORD_CACHE_SIZE:
                evicted, _ = self._records.popitem(last=False)
                self._cores.pop(evicted, None)

    def labels(self, record_ids: Iterable[str]) -> dict[str, frozenset[str]]:
        labels = self._labels
        return {rid: found for rid in record_ids if (found := labels.get(rid)) is not None}

    def remember_labels(self, labels: dict[str, frozenset[str]]) -> None:
        with self._lock:
            self._labels.update(labels)

    def core(self, record_id: str) -> tuple[dict[str, Any], bytes] | None:
        return self._cores.get(record_id)

    def remember_core(self, record_id: str, core: tuple[dict[str, Any], bytes]) -> None:
        with self._lock:
            if record_id in self._records:  # only alongside its cached body (evicted together)
                self._cores[record_id] = core
