"""Verify a stopped store, read-only: journal chains and heads, digests, orphans, projections.

``verify_store`` opens DuckDB read-only and holds the data directory's advisory lock while it
runs (so no server starts meanwhile; a running server makes it refuse with StoreBusyError,
an absent or foreign directory with NoStoreError, as ``rebuild-index`` does). It checks:

* each scope's journal: the hash chain and dense cursors (``Database.verify_journal``), that each
  row's columns agree with its hashed body, and that ``scopes.high_water``/``last_event_hash``
  are the journal's head; a failure here is ``JOURNAL_CORRUPT`` (``VerifyReport.code``);
* lifecycle rows against the journal: one capture event per candidate, a candidate's state
  matching its admission/withdraw event, a record per accepted candidate and none without one,
  each record's state the one its events (admission, host operations, expiry, forget) lead to,
  a tombstone event (and a tombstoned payload) per tombstoned record;
* digests (``deep``): a pending candidate's sealed payload still yields its payload and record
  digests; a live record's sealed body its record digest, record id and payload digest;
* orphans: every key file under ``keys/`` referenced by a row, every pending candidate and
  every record not forgotten holding its key file and sealed body, every embedding row belonging
  to a record whose key still exists;
* projections (``deep``): the live Tantivy/vector projections equal a fresh rebuild built aside
  (store/maintenance/rebuild.py's comparison), on a copy, so nothing under the data directory changes. A
  projection whose cursor lags the journal is reported as stale (the next open rebuilds it
  before use), not as a difference.

Problems are plain sentences naming scopes, ids and counts, never record content.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engram_memory.models.digests import ZERO_DIGEST, payload_digest, record_digest, record_id_from_digest
from engram_memory.models.states import CandidateState, Operation, RecordState
from engram_memory.retrieval.projections import Projections, scope_dirname
from engram_memory.store.backend import SCOPED_TABLES, DataKeys, Inspector, StoreBusyError
from engram_memory.store.core.crypto import open_sealed
from engram_memory.store.core.lifecycle import Lifecycle, pending_context, record_context
from engram_memory.store.core.refusals import JOURNAL_CORRUPT
from engram_memory.store.host.hostops import state_after
from engram_memory.store.maintenance.rebuild import build_aside, compare_projections, existing_scopes
from engram_memory.store.opening import embedded, shared

MAX_LISTED = 10  # per check and scope: beyond that, a count
# Fields a record adds to its payload (store/core/lifecycle.py _build_record).
RECORD_FIELDS = frozenset({"payload_digest", "recorded_at", "recorded_cursor", "authorization_receipt_digest",
                           "trust", "record_digest", "record_id"})
CANDIDATE_EVENT = {CandidateState.ACCEPTED: Operation.ACCEPT.value, CandidateState.REJECTED: Operation.REJECT.value,
                   CandidateState.WITHDRAWN: Operation.WITHDRAW.value}


@dataclass(frozen=True)
class ScopeResult:
    scope_ref: str
    events: int
    chain_ok: bool  # hash chain, cursors, columns and head
    candidates: int
    records: int  # records not forgotten
    projection: str  # equal | differs | stale | not checked
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"scope_ref": self.scope_ref, "events": self.events, "chain_ok": self.chain_ok,
                "candidates": self.candidates, "records": self.records, "projection": self.projection,
                "problems": list(self.problems)}


@dataclass(frozen=True)
class VerifyReport:
    data_dir: str
    deep: bool
    scopes: list[ScopeResult]
    problems: list[str]  # every problem, store-wide ones first
    code: str | None  # JOURNAL_CORRUPT when a chain or a head fails, else None
    key_files: int = 0
    # Of the problems, those an interrupted write leaves (a crash, a SIGKILL) and the next open of
    # the store repairs by itself (it destroys orphan data keys); see ``recoverable_only``.
    recoverable: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def recoverable_only(self) -> bool:
        """Every problem is of the recoverable kind: nothing is lost, the next open repairs it."""
        return bool(self.problems) and all(p in self.recoverable for p in self.problems)

    def as_dict(self) -> dict[str, Any]:
        return {"data_dir": self.data_dir, "deep": self.deep, "ok": self.ok, "code": self.code,
                "key_files": self.key_files, "problems": list(self.problems),
                "recoverable": self.recoverable_only, "scopes": [s.as_dict() for s in self.scopes]}


def _held(data_dir: Path) -> Any:
    """Hold the store's advisory lock (never creating it): no server starts while we read."""
    return embedded().held(data_dir, lambda: StoreBusyError(
        f"data directory {data_dir} is in use by another engram-memory process"))


def _listed(problems: list[str], what: str, ids: list[str]) -> None:
    if not ids:
        return
    shown = ", ".join(sorted(ids)[:MAX_LISTED])
    more = f" and {len(ids) - MAX_LISTED} more" if len(ids) > MAX_LISTED else ""
    problems.append(f"{len(ids)} {what}: {shown}{more}")


class _Verifier:
    def __init__(self, data_dir: Path | None, store: Inspector, deep: bool, keys: DataKeys) -> None:
        # data_dir: where the projections are (None: a shared store's live in each node, not checked here)
        self.data_dir, self.store, self.deep, self.keys = data_dir, store, deep, keys
        self.corrupt = False
        self.recoverable: list[str] = []

    def key_exists(self, key_ref: str) -> bool:
        return self.keys.exists(key_ref)

    def load_key(self, key_ref: str) -> bytes | None:
        return self.keys.load(key_ref)

    def open_json(self, key_ref: str | None, sealed: bytes, context: bytes) -> Any:
        """The JSON a sealed blob holds, or None when its key is missing or it fails to open."""
        dek = self.load_key(key_ref) if key_ref else None
        if dek is None:
            return None
        try:
            return json.loads(open_sealed(dek, sealed, context))
        except ValueError:  # failed authentication, or not JSON
            return None

    # -- store-wide ----------------------------------------------------------------------

    def global_problems(self) -> tuple[list[str], int]:
        problems: list[str] = []
        problem = self.keys.problem()
        if problem is not None:
            problems.append(problem)
        orphans, count = self.keys.census(self.store.referenced_keys())
        _listed(problems, "data keys referenced by no candidate or record (an interrupted write; "
                "the next open destroys them)", orphans)
        if orphans:
            self.recoverable.append(problems[-1])
        listed = self.store.listed_scopes()
        for table in SCOPED_TABLES:
            stray = [s for s in self.store.scopes_in(table) if s not in listed]
            if stray:
                problems.append(f"{table} has rows under {len(stray)} scope(s) the scopes table does not list")
                if table == "journal":
                    self.corrupt = True
        return problems, count

    # -- one scope -----------------------------------------------------------------------

    def scope(self, scope_ref: str) -> ScopeResult:
        problems: list[str] = []
        events, chain_ok = self.journal(scope_ref, problems)
        self.lifecycle(scope_ref, problems)
        candidates = self.candidates(scope_ref, problems)
        records = self.records(scope_ref, problems)
        projection = self.projections(scope_ref, problems) if self.deep and self.data_dir is not None \
            else "not checked"
        return ScopeResult(scope_ref, events, chain_ok, candidates, len(records), projection,
                           [f"{scope_ref}: {p}" for p in problems])

    def journal(self, scope_ref: str, problems: list[str]) -> tuple[int, bool]:
        ok = self.store.verify_journal(scope_ref)
        if not ok:
            problems.append("the journal's hash chain or cursor sequence does not verify")
        rows = self.store.journal_rows(scope_ref)
        # verify_journal hashes the body; the columns read by queries must say the same thing.
        mismatched = []
        for cursor, event_id, operation, body, event_hash in rows:
            try:
                event = json.loads(body)
            except ValueError:
                mismatched.append(str(cursor))
                continue
            if (event.get("cursor"), event.get("event_id"), event.get("operation"), event.get("event_hash")) != (
                    str(cursor), event_id, operation, event_hash):
                mismatched.append(str(cursor))
        if mismatched:
            ok = False
            _listed(problems, "journal rows whose columns differ from their hashed body, at cursors", mismatched)
        head = self.store.head(scope_ref)
        last_cursor, last_hash = (int(rows[-1][0]), rows[-1][4]) if rows else (0, ZERO_DIGEST)
        if (int(head[0]), head[1]) != (last_cursor, last_hash):
            ok = False
            problems.append(f"the scope's head (high_water {head[0]}) is not the journal's last event "
                            f"(cursor {last_cursor}) or its hash differs")
        if int(head[2]) > int(head[0]):
            ok = False
            problems.append(f"the projection cursor {head[2]} is beyond the journal's high water {head[0]}")
        if not ok:
            self.corrupt = True
        return len(rows), ok

    def lifecycle(self, scope_ref: str, problems: list[str]) -> None:
        """Lifecycle rows against the journal: each logical operation once, states agreeing."""
        ops: dict[str, list[str]] = {}
        for event_id, operation in self.store.journal_operations(scope_ref):
            ops.setdefault(event_id.split(":", 1)[1] if ":" in event_id else event_id, []).append(operation)
        candidates = self.store.candidate_states(scope_ref)
        known = {cid for cid, _ in candidates}
        no_capture, wrong_state = [], []
        for cid, state in candidates:
            seen = ops.get(cid, [])
            if seen.count("capture") != 1:
                no_capture.append(cid)
            decided = [op for op in seen if op != "capture"]
            expected = CANDIDATE_EVENT.get(CandidateState(state)) if state in set(CandidateState) else None
            if decided != ([expected] if expected else []):
                wrong_state.append(cid)
        _listed(problems, "candidates without exactly one capture event", no_capture)
        _listed(problems, "candidates whose state disagrees with their journal events", wrong_state)
        captured = [key for key, seen in ops.items() if "capture" in seen and key not in known]
        _listed(problems, "capture events without a candidate row", captured)
        records = self.store.record_links(scope_ref)
        by_candidate = {cid: rid for rid, cid, _ in records}
        accepted = [cid for cid, state in candidates if state == CandidateState.ACCEPTED]
        _listed(problems, "accepted candidates without a record", [c for c in accepted if c not in by_candidate])
        states = dict(candidates)
        _listed(problems, "records without an accepted candidate",
                [rid for rid, cid, _ in records if states.get(cid) != CandidateState.ACCEPTED])
        # Each record's state is the one its journal events leave it in (accept, the host
        # operations of store/host/hostops.py, expire, tombstone), folded in cursor order.
        folded: dict[str, str] = {}
        for row in self.store.journal_rows(scope_ref):
            try:
                event = json.loads(row[3])
            except ValueError:
                continue  # reported by journal()
            for rid in {event.get("record_id"), event.get("related_record_id"), *(event.get("record_ids") or ())}:
                state = state_after(event, rid) if rid else None
                if state is not None and folded.get(rid) != RecordState.TOMBSTONED:
                    folded[rid] = state
        _listed(problems, "records whose state is not the one their journal events lead to",
                [rid for rid, _, state in records if folded.get(rid) != state])
        tombstoned = self.store.tombstoned_records(scope_ref)
        bad = [rid for rid, _, state in records
               if (state == RecordState.TOMBSTONED) != ("tombstone" in ops.get(rid, []))
               or (state == RecordState.TOMBSTONED) != (rid in tombstoned)]
        _listed(problems, "records whose tombstone state, event and tombstoned payload disagree", bad)

    def candidates(self, scope_ref: str, problems: list[str]) -> int:
        rows = self.store.candidates(scope_ref)
        missing, lingering, digests = [], [], []
        for cid, state, created, pd, rd, key_ref, sealed, outcome in rows:
            if state != CandidateState.PENDING:
                # Terminal: its key destroyed and its envelope dropped in the deciding commit.
                if key_ref is not None or sealed is not None or (state != CandidateState.WITHDRAWN and not outcome):
                    lingering.append(cid)
                continue
            if key_ref is None or sealed is None or not self.key_exists(key_ref):
                missing.append(cid)
                continue
            if not self.deep:
                continue
            env = self.open_json(key_ref, sealed, pending_context(cid))
            try:
                record = Lifecycle._build_record(env["payload"], pd, env["recorded_at"], int(created),
                                                 env["authorization_receipt_digest"], env["trust"])
                good = payload_digest(env["payload"]) == pd and record["record_digest"] == rd
            except (ValueError, KeyError, TypeError):  # None or a malformed envelope
                good = False
            if not good:
                digests.append(cid)
        _listed(problems, "pending candidates without their key file or sealed envelope", missing)
        _listed(problems, "decided candidates still holding a key, an envelope, or no outcome", lingering)
        _listed(problems, "pending candidates whose sealed payload does not yield their digests", digests)
        return len(rows)

    def records(self, scope_ref: str, problems: list[str]) -> list[str]:
        rows = self.store.records(scope_ref)
        missing, shredded_left, digests, alive = [], [], [], []
        for rid, state, rd, pd, key_ref, body, candidate_rd in rows:
            if state == RecordState.TOMBSTONED:
                if key_ref is not None or body is not None:
                    shredded_left.append(rid)
                continue
            alive.append(rid)
            if key_ref is None or body is None or not self.key_exists(key_ref):
                missing.append(rid)
                continue
            if candidate_rd is not None and candidate_rd != rd:
                digests.append(rid)
                continue
            if not self.deep:
                continue
            record = self.open_json(key_ref, body, record_context(rid))
            try:
                payload = {k: v for k, v in record.items() if k not in RECORD_FIELDS}
                good = (record_digest(record) == rd == record.get("record_digest")
                        and record_id_from_digest(rd) == rid == record.get("record_id")
                        and payload_digest(payload) == pd == record.get("payload_digest"))
            except (AttributeError, ValueError, KeyError, TypeError):  # None or a malformed record
                good = False
            if not good:
                digests.append(rid)
        _listed(problems, "records not forgotten without their key file or sealed body", missing)
        _listed(problems, "forgotten records still holding a key or a body", shredded_left)
        _listed(problems, "records whose sealed body does not yield their digests or id", digests)
        keyed = {rid for rid, state, *_rest in rows if state != RecordState.TOMBSTONED}
        stale = [rid for rid in self.store.embedded_records(scope_ref) if rid not in keyed]
        _listed(problems, "embedding rows for records that are forgotten or absent", stale)
        return alive

    # -- projections ---------------------------------------------------------------------

    def projections(self, scope_ref: str, problems: list[str]) -> str:
        assert self.data_dir is not None
        cursor = self.store.projection_cursor(scope_ref)
        live_dir = self.data_dir / "projections" / scope_dirname(scope_ref)
        records = self._current_records(scope_ref)
        if not live_dir.is_dir():
            return "stale" if records else "equal"
        with tempfile.TemporaryDirectory(prefix="engram-verify-") as tmp:
            # Opening a Tantivy index takes its writer lock: work on a copy, the data dir stays untouched.
            copy_root = Path(tmp) / "live"
            shutil.copytree(live_dir, copy_root / live_dir.name)
            live = Projections(copy_root)
            try:
                # No cursor yet (a scope of captures only) reflects cursor 0: nothing was projected.
                if (live.lexical(scope_ref).cursor or "0") != str(cursor):
                    return "stale"  # the next open rebuilds it before the scope's first use
                vectors = self._stored_vectors(scope_ref, problems)
                built = build_aside(Path(tmp) / "built", live, scope_ref, records, vectors, cursor)
                try:
                    diffs = compare_projections(live, built, scope_ref, records, vectors)
                finally:
                    built.close()
            finally:
                live.close()
        problems.extend(f"projection differs from a fresh rebuild: {d}" for d in diffs)
        return "differs" if diffs else "equal"

    def _current_records(self, scope_ref: str) -> list[dict[str, Any]]:
        out = []
        for rid, key_ref, body in self.store.current_bodies(scope_ref, RecordState.ACCEPTED_CURRENT.value):
            record = self.open_json(key_ref, body, record_context(rid))
            if record is not None:  # otherwise reported by records()
                out.append(record)
        return out

    def _stored_vectors(self, scope_ref: str, problems: list[str]) -> tuple[list[str], np.ndarray] | None:
        """The current records' stored embeddings, as the engine would index them (None: none stored)."""
        current = RecordState.ACCEPTED_CURRENT.value
        digests = self.store.embedding_models(scope_ref, current)
        if not digests:
            return None
        if len(digests) > 1:
            from engram_memory.retrieval.embedder import compute_model_digest, packaged_model_path

            path = packaged_model_path()
            model = compute_model_digest(path) if path is not None else None
            if model not in digests:
                problems.append("embeddings of several models and none of the packaged one: vectors not compared")
                return None
            digests = [model]
        ids, vecs = [], []
        for rid, key_ref, blob in self.store.embeddings(scope_ref, current, digests[0]):
            dek = self.load_key(key_ref) if key_ref else None
            if dek is None:
                continue
            ids.append(rid)
            vecs.append(np.frombuffer(open_sealed(dek, blob, record_context(rid)), dtype=np.float32))
        return (ids, np.vstack(vecs)) if ids else None


def verify_store(data_dir: Path, *, deep: bool = True) -> VerifyReport:
    """Verify the stopped store at ``data_dir`` without changing it (see the module docstring).

    Raises NoStoreError (no engram-memory store there) and StoreBusyError (a server holds it)."""
    data_dir = Path(data_dir)
    scopes = existing_scopes(data_dir)
    with _held(data_dir):
        store = embedded().inspector(data_dir)
        try:
            verifier = _Verifier(data_dir, store, deep, store.data_keys())
            problems, key_files = verifier.global_problems()
            results = [verifier.scope(scope) for scope in scopes]
        finally:
            store.close()
    for result in results:
        problems.extend(result.problems)
    return VerifyReport(str(data_dir), deep, results, problems, JOURNAL_CORRUPT if verifier.corrupt else None,
                        key_files, verifier.recoverable)


def verify_postgres(url: str, master_key: bytes, key_file: Path, *, deep: bool = True) -> VerifyReport:
    """Verify a PostgreSQL store, live: every check above but the projections (each node's own
    caches, rebuilt from the store), on one read-only snapshot, with the master key file given
    (its data keys are rows wrapped by it). Raises StoreRefused for a database that is not an
    initialised store or a key that is not its master key."""
    kind = shared(url)
    store = kind.inspector(url, master_key, key_file)
    try:
        verifier = _Verifier(None, store, deep, store.data_keys())
        problems, key_count = verifier.global_problems()
        results = [verifier.scope(scope) for scope in store.scopes()]
    finally:
        store.close()
    for result in results:
        problems.extend(result.problems)
    return VerifyReport(kind.redact_url(url), deep, results, problems, JOURNAL_CORRUPT if verifier.corrupt else None,
                        key_count, verifier.recoverable)
