"""The audit trail's writer: rows appended in batches by one thread.

Every call leaves a row; committing each on its own costs a DuckDB commit (a WAL sync) per
call, which was a fifth of the server's CPU under load. Rows are queued and written together
at most ``FLUSH_S`` later, in one transaction, on the writer's own connection (outside the
engine lock: audit appends never conflict with the lifecycle). Closing flushes what is left;
a crash can lose the last ``FLUSH_S`` of audit rows, never a memory operation.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from engram_memory.store.backend import Store

log = logging.getLogger("engram.audit")

FLUSH_S = 0.05
MAX_BATCH = 1024


class AuditWriter:
    def __init__(self, db: Store) -> None:
        self._db = db
        self._rows: list[list[Any]] = []
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="engram-audit", daemon=True)
        self._thread.start()

    def append(self, row: list[Any]) -> None:
        with self._cond:
            if self._closing:
                raise RuntimeError("audit writer closed")
            self._rows.append(row)
            if len(self._rows) >= MAX_BATCH:
                self._cond.notify()

    def flush(self) -> None:
        """Write what is queued now (tests and close)."""
        with self._cond:
            rows, self._rows = self._rows, []
        self._write(rows)

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        self.flush()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._closing and len(self._rows) < MAX_BATCH:
                    self._cond.wait(FLUSH_S)
                rows, self._rows = self._rows, []
                closing = self._closing
            self._write(rows)
            if closing:
                return

    def _write(self, rows: list[list[Any]]) -> None:
        if not rows:
            return
        try:
            self._db.append_audit(rows)
        except Exception:
            log.exception("%d audit rows could not be written", len(rows))
