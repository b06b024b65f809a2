"""DuckDB schema, applied through a migrations ledger (each migration's SQL digest is recorded)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import duckdb

from engram_memory.retrieval._files import fsync_dir
from engram_memory.store.core.timeutil import to_instant, wall_clock

MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "core lifecycle tables",
        """
        CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL);
        -- one row per tenant/workspace scope: its own dense cursor and hash chain
        CREATE TABLE scopes (
            scope_ref VARCHAR PRIMARY KEY,
            high_water UBIGINT NOT NULL,
            last_event_hash VARCHAR NOT NULL,
            projection_cursor UBIGINT NOT NULL
        );
        CREATE TABLE journal (
            scope_ref VARCHAR NOT NULL,
            cursor UBIGINT NOT NULL,
            event_id VARCHAR NOT NULL,
            operation VARCHAR NOT NULL,
            body VARCHAR NOT NULL,
            event_hash VARCHAR NOT NULL,
            PRIMARY KEY (scope_ref, cursor),
            UNIQUE (scope_ref, event_id)
        );
        CREATE TABLE candidates (
            candidate_id VARCHAR PRIMARY KEY,
            scope_ref VARCHAR NOT NULL,
            principal VARCHAR NOT NULL,
            state VARCHAR NOT NULL,          -- pending | accepted | rejected | withdrawn
            created_cursor UBIGINT NOT NULL,
            recorded_at VARCHAR NOT NULL,
            payload_digest VARCHAR NOT NULL,
            record_digest VARCHAR NOT NULL,
            key_ref VARCHAR,                 -- NULL once the data key is destroyed
            envelope BLOB,                   -- sealed candidate; NULL once terminal
            outcome VARCHAR                  -- JCS admission outcome once decided
        );
        CREATE TABLE records (
            record_id VARCHAR PRIMARY KEY,
            scope_ref VARCHAR NOT NULL,
            candidate_id VARCHAR NOT NULL,
            state VARCHAR NOT NULL,
            record_digest VARCHAR NOT NULL,
            payload_digest VARCHAR NOT NULL,
            recorded_cursor UBIGINT NOT NULL,
            valid_t BIGINT NOT NULL,
            valid_t_end BIGINT,
            expires_at_ms BIGINT,
            key_ref VARCHAR,                 -- NULL once forgotten (crypto-shredded)
            body BLOB                        -- sealed record JCS; NULL once forgotten
        );
        CREATE INDEX records_scope ON records (scope_ref, state);
        CREATE TABLE embeddings (
            record_id VARCHAR NOT NULL,
            model_digest VARCHAR NOT NULL,
            scope_ref VARCHAR NOT NULL,
            vector BLOB NOT NULL,            -- sealed with the record's key
            PRIMARY KEY (record_id, model_digest)
        );
        CREATE TABLE tombstoned_payloads (
            scope_ref VARCHAR NOT NULL,
            payload_digest VARCHAR NOT NULL,
            record_id VARCHAR NOT NULL,
            cursor UBIGINT NOT NULL,
            PRIMARY KEY (scope_ref, payload_digest, record_id)
        );
        CREATE TABLE idempotency (
            scope_ref VARCHAR NOT NULL,
            principal VARCHAR NOT NULL,
            key_digest VARCHAR NOT NULL,     -- SHA-256 of the key; the raw key is not kept
            tool VARCHAR NOT NULL,
            intent_hash VARCHAR NOT NULL,
            value VARCHAR NOT NULL,          -- JCS of the first success value
            created_at VARCHAR NOT NULL,
            PRIMARY KEY (scope_ref, principal, key_digest)
        );
        CREATE TABLE audit (
            audit_id VARCHAR PRIMARY KEY,
            called_at VARCHAR NOT NULL,
            scope_ref VARCHAR NOT NULL,
            principal VARCHAR NOT NULL,
            agent_id VARCHAR NOT NULL,
            session VARCHAR NOT NULL,
            tool VARCHAR NOT NULL,
            ok BOOLEAN NOT NULL,
            code VARCHAR,
            idk VARCHAR
        );
        """,
    ),
    (
        2,
        "audit records the signed context's jti",
        """
        ALTER TABLE audit ADD COLUMN context_jti VARCHAR;
        """,
    ),
    (
        3,
        "records keep primary_event.at: the event order search's rerank stage reads",
        """
        ALTER TABLE records ADD COLUMN event_at BIGINT;
        """,
    ),
    (
        4,
        "records keep primary_event.type_ref: whether a record is a conversation turn",
        """
        ALTER TABLE records ADD COLUMN event_type VARCHAR;
        """,
    ),
    (
        5,
        "requests awaiting an operator's approval (clients without elicitation)",
        """
        CREATE TABLE approvals (
            request_id VARCHAR PRIMARY KEY,
            scope_ref VARCHAR NOT NULL,
            principal VARCHAR NOT NULL,
            agent_id VARCHAR NOT NULL,
            tool VARCHAR NOT NULL,
            target VARCHAR NOT NULL,
            key_digest VARCHAR NOT NULL,     -- SHA-256 of the idempotency key; the raw key is sealed
            intent_hash VARCHAR NOT NULL,    -- the operation digest (the ledger's intent hash)
            context VARCHAR NOT NULL,        -- JCS of the bound host context
            key_ref VARCHAR,                 -- NULL once decided or expired (the arguments unreadable)
            arguments BLOB,                  -- the call's arguments, sealed; NULL once decided
            status VARCHAR NOT NULL,         -- pending | approved | denied | expired
            created_at_ms BIGINT NOT NULL,
            expires_at_ms BIGINT NOT NULL,
            decided_at_ms BIGINT,
            reason VARCHAR,                  -- the operator's reason (screened for secrets)
            outcome VARCHAR,                 -- "ok" or the error code of the approved call
            UNIQUE (scope_ref, principal, key_digest)
        );
        """,
    ),
    (
        6,
        "records keep a keyed digest of the event type, never the agent-written type itself",
        """
        ALTER TABLE records ADD COLUMN IF NOT EXISTS event_kind VARCHAR;
        -- event_type stays as an always-NULL column (DuckDB cannot drop a column of an indexed
        -- table); rows stored before get their kind from their sealed body
        UPDATE records SET event_type = NULL WHERE event_type IS NOT NULL;
        -- the old values stay in free blocks of the file: the opening process rewrites it
        INSERT INTO meta VALUES ('rewrite_pending', '6') ON CONFLICT (key) DO NOTHING;
        """,
    ),
]
# Set by a migration that left agent-written plaintext in the file's free blocks (DuckDB does not
# overwrite a block it frees): the store is copied into a fresh file at open (rewrite_if_pending).
REWRITE_PENDING = "rewrite_pending"


def rewrite_if_pending(con: duckdb.DuckDBPyConnection, path: Path) -> duckdb.DuckDBPyConnection:
    """The connection to the store at ``path``, copied first into a fresh file when a migration
    asked for it (``REWRITE_PENDING``): only live rows are written, so nothing a freed block held
    survives. Crash-safe: the marker leaves with the fresh copy only, which replaces the file
    atomically once complete; until then the old file (marker included) stays as it was."""
    if con.execute("SELECT 1 FROM meta WHERE key = ?", [REWRITE_PENDING]).fetchone() is None:
        return con
    fresh = path.with_name(path.name + ".rewrite")
    for leftover in (fresh, fresh.with_name(fresh.name + ".wal")):
        leftover.unlink(missing_ok=True)  # an earlier rewrite cut short
    (name,) = con.execute("SELECT current_database()").fetchone() or ("",)
    con.execute("ATTACH ? AS engram_rewrite", [str(fresh)])
    con.execute(f'COPY FROM DATABASE "{name}" TO engram_rewrite')
    con.execute("DELETE FROM engram_rewrite.meta WHERE key = ?", [REWRITE_PENDING])
    con.execute("DETACH engram_rewrite")
    con.close()  # checkpoints: no WAL of the old file is left to replay into the new one
    fd = os.open(fresh, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(fresh, 0o600)
    os.replace(fresh, path)
    fsync_dir(path.parent)
    return duckdb.connect(str(path))


def migrate(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL,"
        " digest VARCHAR NOT NULL, applied_at VARCHAR NOT NULL)"
    )
    applied = {v: d for v, d in con.execute("SELECT version, digest FROM schema_migrations").fetchall()}
    for version, name, sql in MIGRATIONS:
        digest = "sha256:" + hashlib.sha256(sql.encode()).hexdigest()
        if version in applied:
            if applied[version] != digest:
                raise RuntimeError("migration ledger does not match the code (MIGRATION_LEDGER_INVALID)")
            continue
        con.begin()
        try:
            con.execute(sql)
            con.execute(
                "INSERT INTO schema_migrations VALUES (?, ?, ?, ?)",
                [version, name, digest, to_instant(wall_clock())],
            )
            con.commit()
        except Exception:
            con.rollback()
            raise
