"""What the operator console (server/console/) reads of a store it holds open.

The console owns the store while it runs (a DuckDB data dir's lock, or an admin node of a
PostgreSQL store: store/core/admin_node.py), so it reads through the open engine: the same rows the
admin listings read (store/host/history.py's allow-lists), counts by state, a record's decrypted body
(its citations; record content is the operator's to see), the audit trail without arguments, and a
search with its rank receipt explained. A pending candidate's content is opened only by
``reveal_candidate``, which leaves an audit row first. Nothing here writes a journal event.

Every function takes the scope it reads; the caller decides which scopes an operator may see
(a console bound to one scope passes no other). The queries themselves live in the backends
(store/duckdb/console.py, store/postgres/console.py), by name.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from engram_memory.models.limits import CHANNEL_DEPTH
from engram_memory.models.states import CandidateState, RecordState
from engram_memory.retrieval.ranking import rank, weak_semantic
from engram_memory.store.core.crypto import open_sealed
from engram_memory.store.core.engine import AuditEvent, Engine
from engram_memory.store.core.lifecycle import event_type, pending_context, primary_text
from engram_memory.store.core.timeutil import from_instant
from engram_memory.store.host.history import candidate_listing, event_instant, journal_listing

# The operator's identity in journal contexts and audit rows the console writes (a host id).
OPERATOR = "operator"
CONSOLE_AGENT = "console"
CONSOLE_PURPOSE = "purpose:operator-console"
RECORD_STATES = tuple(s.value for s in RecordState)
CANDIDATE_STATES = tuple(s.value for s in CandidateState)
# The plot's three series: journal operations an operator watches over time.
ACTIVITY = {"accept": "admitted", "reject": "rejected", "tombstone": "forgotten"}
LISTED = 200  # rows per listing page (records, journal, audit): a console, not an export


@contextmanager
def held(engine: Engine) -> Iterator[None]:
    """What every console call runs under. DuckDB: the engine's write lock (re-entrant, and its
    owner may read), so the console's reads on the store's own connection never meet the engine's
    background work (the semantic backfill writes on that connection); the operations the console
    runs take it again. A PostgreSQL node reads through its pool and takes nothing here (a forget
    there waits for other nodes' acknowledgements without the lock)."""
    if engine.db.shared:
        yield
        return
    with engine._rw.write():
        yield


def _rows(engine: Engine, query: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """A named console query (``Store.console_rows``: store/duckdb/console.py, store/postgres/console.py)."""
    if engine.db.shared:  # a node reads through its pool
        return engine.db.console_rows(query, params)
    # The engine's read side excludes its own writes; each thread reads on its own cursor.
    with engine._rw.read():
        return engine.db.console_rows(query, params)


def scope_pair(scope_ref: str) -> str:
    """``tenant:T/workspace:W`` as ``T/W`` (how an operator names a scope)."""
    tenant, _, workspace = scope_ref.partition("/")
    return f"{tenant.removeprefix('tenant:')}/{workspace.removeprefix('workspace:')}"


def scope_ref_of(pair: str) -> str:
    tenant, _, workspace = pair.partition("/")
    return f"tenant:{tenant}/workspace:{workspace}"


def operator_context(scope_ref: str, session: str = "console") -> Any:
    """The host context of the console's own calls in a scope: the operator, never an agent."""
    from engram_memory.models.context import HostContext

    tenant, _, workspace = scope_pair(scope_ref).partition("/")
    return HostContext(tenant, workspace, OPERATOR, CONSOLE_AGENT, CONSOLE_PURPOSE, session)


# -- scopes ------------------------------------------------------------------------------------


def scope_summary(engine: Engine, scope_ref: str) -> dict[str, Any]:
    """A scope's counts by state (records and candidates), its journal head and projection cursor."""
    records = dict.fromkeys(RECORD_STATES, 0)
    for state, n in _rows(engine, "record_states", [scope_ref]):
        records[state] = int(n)
    candidates = dict.fromkeys(CANDIDATE_STATES, 0)
    for state, n in _rows(engine, "candidate_states", [scope_ref]):
        candidates[state] = int(n)
    head = _rows(engine, "scope_head", [scope_ref])
    high_water, projection = (int(head[0][0]), int(head[0][1])) if head else (0, 0)
    return {"scope_ref": scope_ref, "scope": scope_pair(scope_ref), "records": records, "candidates": candidates,
            "high_water": high_water, "projection_cursor": projection}


def journal_status(engine: Engine, scope_ref: str) -> dict[str, Any]:
    """The hash chain's status (Database.verify_journal: every event's hash and link, dense cursors;
    the chain check ``admin verify`` starts with), the journal head, the cursors the projections reflect, and the data
    dir's last backup (store/maintenance/backup.py notes it; a PostgreSQL store's backups are not noted)."""
    from pathlib import Path

    from engram_memory.store.maintenance.backup import last_backup

    db: Any = engine.db
    if db.shared:
        chain_ok = bool(db.verify_journal(scope_ref))
    else:
        with engine._rw.read():
            chain_ok = bool(db.verify_journal(scope_ref))
    lexical = engine.projections.lexical(scope_ref).cursor
    vectors = engine.projections.vectors(scope_ref).cursor
    summary = scope_summary(engine, scope_ref)
    backup = None if db.shared else last_backup(Path(engine.config.data_dir))
    return {"chain_ok": chain_ok, "last_backup": backup, "high_water": summary["high_water"],
            "projection_cursor": summary["projection_cursor"],
            "lexical_cursor": str(lexical) if lexical else "none", "vector_cursor": str(vectors) if vectors else "none"}


# -- candidates --------------------------------------------------------------------------------


def pending_candidates(engine: Engine, scope_ref: str) -> list[dict[str, Any]]:
    """Metadata of the scope's pending candidates (as ``admin candidates``: never content)."""
    return candidate_listing(_rows(engine, "pending_candidates", [scope_ref]))


def reveal_candidate(engine: Engine, scope_ref: str, candidate_id: str, session: str) -> dict[str, Any] | None:
    """A pending candidate's payload, opened for the operator: an audit row (tool ``console_reveal``,
    the operator, the console's session) is queued and flushed before the content is returned.
    None when the scope holds no such pending candidate (or its key is gone)."""
    candidate = engine.db.candidate(candidate_id, scope_ref)
    if candidate is None or candidate.state != CandidateState.PENDING or candidate.key_ref is None \
            or candidate.envelope is None:
        return None
    dek = engine.keys.load(candidate.key_ref)
    if dek is None:
        return None
    record_console_call(engine, scope_ref, "console_reveal", session, ok=True)
    envelope = json.loads(open_sealed(dek, candidate.envelope, pending_context(candidate_id)))
    return dict(envelope["payload"])


def record_console_call(engine: Engine, scope_ref: str, tool: str, session: str, *, ok: bool,
                        code: str | None = None) -> None:
    """One audit row for an operator action in the console (written now, not batched)."""
    engine.record_audit(operator_context(scope_ref, session),
                        AuditEvent("console:" + secrets.token_hex(12), tool, ok, code, None))
    engine.audit.flush()


# -- records -----------------------------------------------------------------------------------


def records(engine: Engine, scope_ref: str, state: str | None = None) -> list[dict[str, Any]]:
    """The scope's records (newest first): ids, states, cursors, digests, and the first
    ``EXCERPT_CHARS`` characters of each primary component's text while its key exists."""
    if state is None:
        rows = _rows(engine, "records", [scope_ref, LISTED])
    else:
        rows = _rows(engine, "records_in_state", [scope_ref, state, LISTED])
    opened = _excerpts(engine, scope_ref, [row[0] for row in rows])
    return [{"record_id": rid, "state": st, "recorded_cursor": int(cur), "record_digest": rd,
             "event_type": opened.get(rid, ("", None))[0], "text": opened.get(rid, ("", None))[1]}
            for rid, st, cur, rd in rows]


EXCERPT_CHARS = 120


def _excerpts(engine: Engine, scope_ref: str, record_ids: list[str]) -> dict[str, tuple[str, str]]:
    """Each record's event type and primary component text, cut to ``EXCERPT_CHARS``, from its sealed
    body (the event type is stored nowhere else in the clear); forgotten records: none."""
    out: dict[str, tuple[str, str]] = {}
    for sealed in engine.db.load_records(record_ids) if record_ids else []:
        if sealed.scope_ref != scope_ref or sealed.body is None:
            continue
        body = engine.lifecycle.load_record(sealed.record_id, sealed.key_ref, sealed.body)
        if body is None:
            continue
        primary = body.get("primary_component_id")
        text = next((c["text"] for c in body.get("components", []) if c.get("component_id") == primary), "")
        excerpt = text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS - 1] + "…"
        out[sealed.record_id] = (event_type(body) or "", excerpt)
    return out


def record_detail(engine: Engine, scope_ref: str, record_id: str) -> dict[str, Any] | None:
    """A record of the scope: its state, its body (components and citations) while its key
    exists, and its lifecycle history: every journal event naming it or its candidate, with the
    receipts each carries. None for an id the scope does not hold."""
    rows = _rows(engine, "record", [scope_ref, record_id])
    if not rows:
        return None
    state, candidate_id, cursor, rd, pd = rows[0]
    body = None
    for sealed in engine.db.load_records([record_id]):
        if sealed.scope_ref == scope_ref and sealed.body is not None:
            body = engine.lifecycle.load_record(record_id, sealed.key_ref, sealed.body)
    return {"record_id": record_id, "scope_ref": scope_ref, "state": state, "candidate_id": candidate_id,
            "recorded_cursor": int(cursor), "record_digest": rd, "payload_digest": pd, "body": body,
            "history": _history(engine, scope_ref, {record_id, candidate_id})}


RECEIPT_FIELDS = ("authorization_receipt_digest", "record_digest", "payload_digest", "previous_event_hash",
                  "related_record_id")


def _history(engine: Engine, scope_ref: str, ids: set[str]) -> list[dict[str, Any]]:
    out = []
    for cursor, body, event_hash in _rows(engine, "journal", [scope_ref]):
        event = json.loads(body)
        named = {event.get("record_id"), event.get("candidate_id"), event.get("related_record_id"),
                 *(event.get("record_ids") or [])}
        if not ids & named:
            continue
        listed = journal_listing([(int(cursor), body, event_hash)])[0]
        host = event.get("host_operation")
        if isinstance(host, dict) and not listed["reason"]:
            listed["reason"] = host.get("reason")  # a host operation's reason (store/host/hostops.py)
        receipts = {k: event[k] for k in RECEIPT_FIELDS if isinstance(event.get(k), str)}
        for nested in ("admission_decision", "adjudication", "host_operation", "receipt"):
            value = event.get(nested)
            if isinstance(value, dict):
                receipts.update({f"{nested}.{k}": v for k, v in value.items() if isinstance(v, str | int | bool)})
        out.append({**listed, "receipts": receipts})
    return out


def record_scope(engine: Engine, record_id: str) -> str | None:
    rows = _rows(engine, "record_scope", [record_id])
    return str(rows[0][0]) if rows else None


# -- journal and audit -------------------------------------------------------------------------


def journal(engine: Engine, scope_ref: str, limit: int = LISTED) -> list[dict[str, Any]]:
    """The scope's last ``limit`` journal events, oldest first (``admin history``'s fields)."""
    rows = _rows(engine, "journal_tail", [scope_ref, int(limit)])
    listed = journal_listing(rows)
    for entry, (_cursor, body, _hash) in zip(listed, reversed(rows), strict=True):
        host = json.loads(body).get("host_operation")
        if isinstance(host, dict) and not entry["reason"]:
            entry["reason"] = host.get("reason")  # a host operation's reason (store/host/hostops.py)
    return listed


def audit(engine: Engine, scope_ref: str, limit: int = LISTED) -> list[dict[str, Any]]:
    """The scope's audit trail, newest first: who called which tool with what outcome. The
    arguments are never stored, so never shown."""
    engine.audit.flush()
    rows = _rows(engine, "audit", [scope_ref, int(limit)])
    return [{"called_at": at, "principal": p, "agent_id": a, "session": s, "tool": t,
             "outcome": "ok" if ok else (code or "error")} for at, p, a, s, t, ok, code in rows]


def activity(engine: Engine, scope_ref: str) -> dict[str, Any]:
    """Admissions, rejections and forgets per day (UTC), from the journal's own instants."""
    per_day: dict[str, Counter[str]] = {}
    for operation, body in _rows(engine, "operations", [scope_ref]):
        if operation not in ACTIVITY:
            continue
        day = datetime.fromtimestamp(from_instant(event_instant(json.loads(body))) / 1000, UTC).date().isoformat()
        per_day.setdefault(day, Counter())[ACTIVITY[operation]] += 1
    days = sorted(per_day)
    return {"days": days, "series": {name: [per_day[d][name] for d in days] for name in ACTIVITY.values()}}


# -- search ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Explained:
    value: dict[str, Any]  # the search tool's whole value
    rows: list[dict[str, Any]]  # per ranked record: channels, fused score, rerank contribution
    floored: list[str]  # semantic-only hits the floor dropped
    fusion: dict[str, Any]


def explain_search(engine: Engine, scope_ref: str, query: str, limit: int = 10) -> Explained:
    """Run the real search as the operator, then explain its rank receipt: each ranked record's
    channel ranks and raw scores (the receipt's own), its fused score before the rerank stage
    (re-derived from the same projections as of the receipt's instant: ReadPath.search's first
    half), and the rerank stage's contribution (final score minus fused score)."""
    from engram_memory.models.tools import SearchInput, to_plain

    ctx = operator_context(scope_ref)
    value = to_plain(engine.search(ctx, SearchInput(query=query, purpose_ref=CONSOLE_PURPOSE, limit=limit)))
    receipt = value["rank_receipt"]
    semantic = receipt["profile"] == "hybrid_v1" and engine.embedder is not None
    vector = engine.embedder.encode([query], kind="query")[0] if semantic and engine.embedder is not None else None
    at = int(receipt["valid_as_of"])
    with engine._rw.read():
        hits: dict[str, list[tuple[str, float]]] = {}
        if "lexical" in engine.config.channels:
            hits["lexical"] = engine.projections.lexical(scope_ref).search(query, CHANNEL_DEPTH)
        if vector is not None:
            hits["semantic"] = engine.projections.vectors(scope_ref).search(vector, CHANNEL_DEPTH)
        eligible = engine._view(scope_ref).eligible({rid for found in hits.values() for rid, _ in found}, at, at)
    hits = {name: [h for h in found if h[0] in eligible] for name, found in hits.items()}
    fused = dict(rank(hits, engine.fusion).fused)
    dropped = sorted(weak_semantic(hits, engine.fusion.semantic_floor))
    reranked = "rerank" in receipt["fusion"]
    rows = []
    for entry in receipt["ranked"]:
        rid = entry["record_id"]
        before = fused.get(rid)
        rows.append({"record_id": rid, "rank": entry["rank"], "score": entry["score"],
                     "channels": {c: entry[c] for c in ("lexical", "semantic") if c in entry},
                     "fused": before,
                     "rerank": (entry["score"] - before) if reranked and before is not None else None})
    return Explained(value, rows, dropped, receipt["fusion"])


def approval_requests(engine: Engine, scope_ref: str) -> list[dict[str, Any]]:
    """The scope's requests awaiting the operator's approval (store/host/approvals.py), each with the
    text of the record or candidate it targets: who asks, what, on what, its digest and age."""
    from engram_memory.store.host.approvals import pending

    out = []
    for request in pending(engine, scope_ref, engine.clock()):
        text = None
        target = request["target"]
        if target.startswith("mem_"):
            detail = record_detail(engine, scope_ref, target)
            if detail is not None and detail["body"] is not None:
                text = primary_text(detail["body"])
        out.append({**request, "text": text})
    return out
