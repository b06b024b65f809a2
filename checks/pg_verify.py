"""Verify a stopped PostgreSQL store and its nodes' projections, read-only (``engram-memory crash --store``).

What ``store/maintenance/verify.py`` checks of a DuckDB store, for the shared one, by SQL of its own (so the
check does not trust the backend's code it checks):

* each scope's journal: dense cursors from 1, each event's ``previous_event_hash`` the one before,
  each ``event_hash`` recomputed over the stored body, and ``scopes`` holding the true head;
* lifecycle rows against the journal: one capture event per candidate and none without one; a
  decided candidate's state matching its accept/reject/withdraw event; a record per accept event
  and none without one; a tombstoned record with its tombstone event, no key, no body and no
  embeddings;
* keys: every pending candidate and current record holds its sealed bytes and a ``data_keys`` row.
  Unreferenced keys are counted, not failed: a key is created in its own commit before the
  mutation that references it, so a kill in between leaves one, and the sweep spares keys younger
  than ``ORPHAN_KEY_GRACE`` (another node's open mutation may own it);
* projections of every node: caught up with the scope's journal (the harness read every scope on
  every node before stopping them) and equal to a fresh rebuild from the store
  (``store/maintenance/rebuild.py``'s comparison). The rebuild's records are decrypted by a real engine opened
  on the store as one more, short-lived node, in a scratch directory.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EVENT_OF_STATE = {"accepted": "accept", "rejected": "reject", "withdrawn": "withdraw"}


@dataclass
class PgVerifyReport:
    problems: list[str] = field(default_factory=list)
    events: int = 0
    orphan_keys: int = 0
    projections: list[str] = field(default_factory=list)  # per node and scope: equal | differs | stale

    @property
    def ok(self) -> bool:
        return not self.problems


def _chain(scope: str, rows: list[tuple[Any, ...]], head: tuple[int, str] | None) -> list[str]:
    from engram_memory.models.digests import ZERO_DIGEST, receipt_digest

    previous, expected = ZERO_DIGEST, 1
    for cursor, body, event_hash in rows:
        event = json.loads(body)
        if int(cursor) != expected:
            return [f"{scope}: journal cursor {cursor} where {expected} was due"]
        if event.get("previous_event_hash") != previous:
            return [f"{scope}: journal event {cursor} does not chain to the one before"]
        if receipt_digest("memory-journal-event", event, "event_hash") != event_hash:
            return [f"{scope}: journal event {cursor} does not hash to its event_hash"]
        previous, expected = event_hash, expected + 1
    if head != (expected - 1, previous) and not (head is None and expected == 1):
        return [f"{scope}: the scope's head {head} is not the journal's ({expected - 1}, {previous[:20]}...)"]
    return []


def _rows(url: str) -> tuple[list[str], int, int]:
    """Journal, lifecycle and key checks: (problems, events, unreferenced keys)."""
    import psycopg

    problems: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        heads = {s: (int(hw), h) for s, hw, h in conn.execute(
            "SELECT scope_ref, high_water, last_event_hash FROM scopes").fetchall()}
        scopes = sorted(set(heads) | {s for (s,) in conn.execute("SELECT DISTINCT scope_ref FROM journal")})
        events = 0
        for scope in scopes:
            rows = conn.execute("SELECT cursor, body, event_hash FROM journal WHERE scope_ref = %s ORDER BY cursor",
                                [scope]).fetchall()
            events += len(rows)
            problems += _chain(scope, rows, heads.get(scope))
        journal = conn.execute("SELECT operation, body::json->>'candidate_id', body::json->>'record_id'"
                               " FROM journal").fetchall()
        captures = Counter(cid for op, cid, _ in journal if op == "capture")
        decided = Counter((op, cid) for op, cid, _ in journal if op in ("accept", "reject", "withdraw"))
        accepted = {rid for op, _, rid in journal if op == "accept"}
        tombstones = Counter(rid for op, _, rid in journal if op == "tombstone")
        candidates = conn.execute(
            "SELECT candidate_id, state, key_ref, envelope IS NOT NULL FROM candidates").fetchall()
        keys = {k for (k,) in conn.execute("SELECT key_ref FROM data_keys")}
        for cid, state, key_ref, sealed in candidates:
            if captures[cid] != 1:
                problems.append(f"candidate {cid} has {captures[cid]} capture events")
            if state in EVENT_OF_STATE and decided[(EVENT_OF_STATE[state], cid)] != 1:
                problems.append(f"candidate {cid} is {state} with {decided[(EVENT_OF_STATE[state], cid)]} such events")
            if state == "pending" and (key_ref not in keys or not sealed):
                problems.append(f"pending candidate {cid} lost its key or sealed payload")
        orphan_events = set(captures) - {c[0] for c in candidates}
        if orphan_events:
            problems.append(f"{len(orphan_events)} capture events without a candidate")
        records = conn.execute("SELECT record_id, state, key_ref, body IS NOT NULL FROM records").fetchall()
        embedded = {r for (r,) in conn.execute("SELECT DISTINCT record_id FROM embeddings")}
        for rid, state, key_ref, sealed in records:
            if rid not in accepted:
                problems.append(f"record {rid} without an accept event")
            if state == "tombstoned":
                if tombstones[rid] != 1 or key_ref is not None or sealed or rid in embedded:
                    problems.append(f"tombstoned record {rid}: {tombstones[rid]} tombstone events, key "
                                    f"{'kept' if key_ref else 'gone'}, body {'kept' if sealed else 'gone'}")
            elif key_ref not in keys or not sealed:
                problems.append(f"{state} record {rid} lost its key or sealed body")
        missing = accepted - {r[0] for r in records}
        if missing:
            problems.append(f"{len(missing)} accept events without a record")
        referenced = {c[2] for c in candidates if c[2]} | {r[2] for r in records if r[2]}
    return problems, events, len(keys - referenced)


def verify_pg_store(url: str, master_key_file: Path, node_dirs: list[Path], scratch: Path) -> PgVerifyReport:
    """Check the stopped store at ``url`` and the projections in each of ``node_dirs`` (see the module)."""
    from engram_memory.models.settings import EngineSettings
    from engram_memory.retrieval.projections import Projections
    from engram_memory.store.core.engine import Engine
    from engram_memory.store.maintenance.rebuild import build_aside, compare_projections

    report = PgVerifyReport()
    report.problems, report.events, report.orphan_keys = _rows(url)
    shutil.rmtree(scratch, ignore_errors=True)
    engine = Engine.open(EngineSettings(data_dir=scratch / "verifier", semantic=False, store=url,
                                        master_key_file=master_key_file))
    try:
        for scope in engine.scopes():
            records = engine.live_records(scope)
            cursor = engine.projection_cursor(scope)
            for k, node_dir in enumerate(node_dirs):
                live = Projections(node_dir / "projections")
                built = None
                try:
                    have = live.lexical(scope).cursor or "0"  # (never written: nothing was admitted yet)
                    if have != str(cursor):
                        report.projections.append("stale")
                        report.problems.append(f"node {k}: projections of {scope} at cursor {have}, the store "
                                               f"at {cursor} (not caught up after reads)")
                        continue
                    built = build_aside(scratch / "aside", live, scope, records, None, cursor)
                    diffs = compare_projections(live, built, scope, records, None)
                    report.projections.append("differs" if diffs else "equal")
                    report.problems += [f"node {k}: {scope}: {d}" for d in diffs]
                finally:
                    live.close()
                    if built is not None:
                        built.close()
    finally:
        engine.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return report
