"""Admissions answer after their own transaction; their projection updates follow in groups.

A record admitted on its own used to pay a Tantivy commit (~30 ms) and its embedding before its
answer. Now the admission's transaction commits, the answer goes back, and the record waits here:
a background thread applies what has gathered -- one Tantivy commit and one batched encode for
every admission that arrived meanwhile, the encoding outside the engine's lock so that captures
and admissions go on beside it. Nothing reads a projection before it is level: every search and
get, every mutation that touches a projection (forget, expiry, a rebuild, a host operation), and
close settle the scope first, inline, under the engine's write lock. So a search right after an
admission sees the record in both channels, as before, and the same state + query + instant still
give the same bytes; only the cost moves from the admission to whoever needs the projection first.

Crash safety is the journal's: a record admitted but not yet projected leaves the lexical
projection's cursor behind the journal, and recovery rebuilds that scope (Engine.recover).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

import numpy as np

log = logging.getLogger("engram_memory.projector")

QUIET_S = 0.004  # a group closes when no admission came for this long ...
MAX_WAIT_S = 0.2  # ... or this long after its first admission
MAX_GROUP = 256  # records encoded in one batch


class _Engine(Protocol):
    _rw: Any

    def _project_admitted(self, scope_ref: str, records: list[dict[str, Any]], cursor: int,
                          vectors: dict[str, np.ndarray] | None = None) -> None: ...

    def _encode_for_projection(self, records: list[dict[str, Any]]) -> np.ndarray | None: ...


class Projector:
    def __init__(self, engine: _Engine) -> None:
        self._engine = engine
        # scope_ref -> (records in admission order, cursor of the last); guarded by the engine's write lock
        self._pending: dict[str, tuple[list[dict[str, Any]], int]] = {}
        self._generation = 0  # bumped by every inline settle: a background group computed before it is stale
        self._first_at = 0.0
        self._last_at = 0.0
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="engram-projector", daemon=True)
        self._thread.start()

    # -- called under the engine's write lock ---------------------------------------------

    def add(self, scope_ref: str, record: dict[str, Any], cursor: int) -> None:
        now = time.monotonic()
        if not self._pending:
            self._first_at = now
        self._last_at = now
        records = self._pending.get(scope_ref, ([], 0))[0]
        records.append(record)
        self._pending[scope_ref] = (records, cursor)
        self._wake.set()

    def waiting(self, scope_ref: str | None = None) -> bool:
        return bool(self._pending) if scope_ref is None else scope_ref in self._pending

    def settle(self, scope_ref: str | None = None) -> None:
        """Project what waits (one scope's, or every scope's) now, inline."""
        scopes = sorted(self._pending) if scope_ref is None else [scope_ref] if scope_ref in self._pending else []
        if not scopes:
            return
        self._generation += 1
        for scope in scopes:
            records, cursor = self._pending.pop(scope)
            self._engine._project_admitted(scope, records, cursor)

    def close(self) -> None:
        """Under the write lock, before the projections close: settle everything, stop the thread."""
        self.settle()
        self._closed = True
        self._wake.set()

    # -- the background thread ------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait()
            if self._closed:
                return
            self._gather()
            try:
                self._apply_group()
            except Exception:  # noqa: BLE001 - a failed group stays pending: the next reader settles it inline
                log.exception("background projection failed; the next read projects inline")
                time.sleep(0.05)

    def _gather(self) -> None:
        """Wait until the admissions stop arriving for a moment (or the group is old or large)."""
        while not self._closed:
            now = time.monotonic()
            pending = sum(len(r) for r, _ in list(self._pending.values()))
            if pending >= MAX_GROUP or now - self._last_at >= QUIET_S or now - self._first_at >= MAX_WAIT_S:
                return
            time.sleep(min(QUIET_S / 2, 0.01))

    def _apply_group(self) -> None:
        engine = self._engine
        with engine._rw.write():
            self._wake.clear()
            if self._closed or not self._pending:
                return
            generation = self._generation
            group = {scope: (list(records[:MAX_GROUP]), cursor, len(records))
                     for scope, (records, cursor) in self._pending.items()}
        # Outside the lock: captures and admissions go on while the group is encoded.
        encoded: dict[str, dict[str, np.ndarray]] = {}
        for scope, (records, _cursor, _n) in group.items():
            vectors = engine._encode_for_projection(records)
            if vectors is not None:
                encoded[scope] = {r["record_id"]: vectors[i] for i, r in enumerate(records)}
        with engine._rw.write():
            if self._closed or generation != self._generation:
                return  # a reader settled inline meanwhile: it projected these records itself
            for scope, (records, cursor, n_then) in sorted(group.items()):
                now_records, now_cursor = self._pending[scope]
                done = len(records)
                # The group's cursor is the last admission it holds (a later one stays pending).
                through = cursor if done == n_then else int(records[-1]["recorded_cursor"])
                engine._project_admitted(scope, records, through, encoded.get(scope))
                rest = now_records[done:]
                if rest:
                    self._pending[scope] = (rest, now_cursor)
                else:
                    del self._pending[scope]
            if self._pending:
                self._first_at = time.monotonic()
                self._wake.set()
