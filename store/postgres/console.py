"""The operator console's reads (store/console/console_reads.py) on a PostgreSQL store (an admin node of it).

Each query by name, run through the store's pool (``Database.all``); the DuckDB twin is
store/duckdb/console.py: the same names, columns and order."""

from __future__ import annotations

from typing import Any

QUERIES = {
    "record_states": "SELECT state, count(*) FROM records WHERE scope_ref = %s GROUP BY state",
    "candidate_states": "SELECT state, count(*) FROM candidates WHERE scope_ref = %s GROUP BY state",
    "scope_head": "SELECT high_water, projection_cursor FROM scopes WHERE scope_ref = %s",
    # (candidate_id, principal, state, created_cursor, recorded_at, payload_digest, record_digest, held)
    "pending_candidates": (
        "SELECT c.candidate_id, c.principal, c.state, c.created_cursor, c.recorded_at, c.payload_digest,"
        " c.record_digest, EXISTS (SELECT 1 FROM tombstoned_payloads t WHERE t.scope_ref = c.scope_ref"
        " AND t.payload_digest = c.payload_digest) FROM candidates c"
        " WHERE c.scope_ref = %s AND c.state = 'pending' ORDER BY c.created_cursor"),
    "records": ("SELECT record_id, state, recorded_cursor, record_digest FROM records"
                " WHERE scope_ref = %s ORDER BY recorded_cursor DESC, record_id LIMIT %s"),
    "records_in_state": ("SELECT record_id, state, recorded_cursor, record_digest FROM records"
                         " WHERE scope_ref = %s AND state = %s ORDER BY recorded_cursor DESC, record_id LIMIT %s"),
    "record": ("SELECT state, candidate_id, recorded_cursor, record_digest, payload_digest FROM records"
               " WHERE scope_ref = %s AND record_id = %s"),
    "record_scope": "SELECT scope_ref FROM records WHERE record_id = %s",
    "journal": "SELECT cursor, body, event_hash FROM journal WHERE scope_ref = %s ORDER BY cursor",
    "journal_tail": "SELECT cursor, body, event_hash FROM journal WHERE scope_ref = %s ORDER BY cursor DESC LIMIT %s",
    "operations": "SELECT operation, body FROM journal WHERE scope_ref = %s ORDER BY cursor",
    "audit": ("SELECT called_at, principal, agent_id, session, tool, ok, code FROM audit"
              " WHERE scope_ref = %s ORDER BY called_at DESC, audit_id LIMIT %s"),
}


def rows(db: Any, name: str, params: list[Any]) -> list[tuple[Any, ...]]:
    return list(db.all(QUERIES[name], params))
