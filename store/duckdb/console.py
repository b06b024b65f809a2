"""The operator console's reads (store/console/console_reads.py) on the DuckDB store it holds open.

Each query by name, run on the calling thread's read connection (``Database.reader``); the
caller holds the engine's lock (console_reads.held). The PostgreSQL twin is
store/postgres/console.py: the same names, columns and order."""

from __future__ import annotations

from typing import Any

QUERIES = {
    "record_states": "SELECT state, count(*) FROM records WHERE scope_ref = ? GROUP BY state",
    "candidate_states": "SELECT state, count(*) FROM candidates WHERE scope_ref = ? GROUP BY state",
    "scope_head": "SELECT high_water, projection_cursor FROM scopes WHERE scope_ref = ?",
    # (candidate_id, principal, state, created_cursor, recorded_at, payload_digest, record_digest, held)
    "pending_candidates": (
        "SELECT c.candidate_id, c.principal, c.state, c.created_cursor, c.recorded_at, c.payload_digest,"
        " c.record_digest, EXISTS (SELECT 1 FROM tombstoned_payloads t WHERE t.scope_ref = c.scope_ref"
        " AND t.payload_digest = c.payload_digest) FROM candidates c"
        " WHERE c.scope_ref = ? AND c.state = 'pending' ORDER BY c.created_cursor"),
    "records": ("SELECT record_id, state, recorded_cursor, record_digest FROM records"
                " WHERE scope_ref = ? ORDER BY recorded_cursor DESC, record_id LIMIT ?"),
    "records_in_state": ("SELECT record_id, state, recorded_cursor, record_digest FROM records"
                         " WHERE scope_ref = ? AND state = ? ORDER BY recorded_cursor DESC, record_id LIMIT ?"),
    "record": ("SELECT state, candidate_id, recorded_cursor, record_digest, payload_digest FROM records"
               " WHERE scope_ref = ? AND record_id = ?"),
    "record_scope": "SELECT scope_ref FROM records WHERE record_id = ?",
    "journal": "SELECT cursor, body, event_hash FROM journal WHERE scope_ref = ? ORDER BY cursor",
    "journal_tail": "SELECT cursor, body, event_hash FROM journal WHERE scope_ref = ? ORDER BY cursor DESC LIMIT ?",
    "operations": "SELECT operation, body FROM journal WHERE scope_ref = ? ORDER BY cursor",
    "audit": ("SELECT called_at, principal, agent_id, session, tool, ok, code FROM audit"
              " WHERE scope_ref = ? ORDER BY called_at DESC, audit_id LIMIT ?"),
}


def rows(db: Any, name: str, params: list[Any]) -> list[tuple[Any, ...]]:
    return list(db.reader().execute(QUERIES[name], params).fetchall())
