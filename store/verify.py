"""STAND-IN for ``verify_store`` (another change provides the full check: digests and projection
agreement too). Same API; this one re-walks each scope's journal hash chain and cursor density
and checks the scope heads, read-only, so ``engram-memory admin verify`` can be written and
tested against it. Replace it wholesale with the full version."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from engram_memory.models.digests import ZERO_DIGEST, receipt_digest


@dataclass
class VerifyReport:
    ok: bool = True
    problems: list[str] = field(default_factory=list)
    code: str | None = None  # "JOURNAL_CORRUPT" when a chain or a head fails
    scopes: int = 0
    events: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "code": self.code, "problems": self.problems,
                "scopes": self.scopes, "events": self.events}


def verify_store(data_dir: Path, *, deep: bool = True) -> VerifyReport:
    report = VerifyReport()
    con = duckdb.connect(str(data_dir / "engram.duckdb"), read_only=True)
    try:
        for scope, high_water, last_hash in con.execute(
            "SELECT scope_ref, high_water, last_event_hash FROM scopes ORDER BY scope_ref"
        ).fetchall():
            report.scopes += 1
            previous, expected = ZERO_DIGEST, 1
            for cursor, body, event_hash in con.execute(
                "SELECT cursor, body, event_hash FROM journal WHERE scope_ref = ? ORDER BY cursor", [scope]
            ).fetchall():
                report.events += 1
                event = json.loads(body)
                if int(cursor) != expected or event.get("previous_event_hash") != previous \
                        or receipt_digest("memory-journal-event", event, "event_hash") != event_hash:
                    report.problems.append(f"{scope}: the journal chain breaks at cursor {cursor}")
                    break
                previous, expected = event_hash, expected + 1
            else:
                if expected - 1 != int(high_water) or previous != last_hash:
                    report.problems.append(f"{scope}: the scope head does not match its journal")
    finally:
        con.close()
    if report.problems:
        report.ok, report.code = False, "JOURNAL_CORRUPT"
    return report
