"""PostgreSQL schema, applied through the same migrations ledger as the DuckDB store (store/duckdb/schema.py).

What differs from DuckDB: cursors are BIGINT with a CHECK >= 0 (PostgreSQL has no unsigned types);
blobs are BYTEA; hashed bodies (the journal's canonical JSON) are TEXT, kept byte-exact, never jsonb
(which reorders keys). What DuckDB kept in files lives in rows, because several nodes share one
store: wrapped data keys, node heartbeats, the signed-context replay cache, the store's identity.

Several nodes may start at once: `migrate` runs in one transaction under a transaction-scoped
advisory lock, so each migration is applied exactly once and a node that waited sees it applied."""

from __future__ import annotations

import hashlib

import psycopg
from psycopg import pq

from engram_memory.store.core.timeutil import to_instant, wall_clock

# The advisory lock every engram-memory node takes to migrate: one constant, shared by all versions.
# (The first eight bytes of SHA-256("engram-memory/postgres/migrate"), as a signed 64-bit key.)
MIGRATE_LOCK_KEY = int.from_bytes(hashlib.sha256(b"engram-memory/postgres/migrate").digest()[:8], "big", signed=True)

MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "core lifecycle tables",
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        -- one row per tenant/workspace scope: its own dense cursor and hash chain
        CREATE TABLE scopes (
            scope_ref TEXT PRIMARY KEY,
            high_water BIGINT NOT NULL CHECK (high_water >= 0),
            last_event_hash TEXT NOT NULL,
            projection_cursor BIGINT NOT NULL CHECK (projection_cursor >= 0)
        );
        CREATE TABLE journal (
            scope_ref TEXT NOT NULL,
            cursor BIGINT NOT NULL CHECK (cursor >= 0),
            event_id TEXT NOT NULL,
            operation TEXT NOT NULL,
            body TEXT NOT NULL,              -- canonical JSON, byte-exact: event_hash is checked over it
            event_hash TEXT NOT NULL,
            PRIMARY KEY (scope_ref, cursor),
            UNIQUE (scope_ref, event_id)
        );
        CREATE TABLE candidates (
            candidate_id TEXT PRIMARY KEY,
            scope_ref TEXT NOT NULL,
            principal TEXT NOT NULL,
            state TEXT NOT NULL,             -- pending | accepted | rejected | withdrawn
            created_cursor BIGINT NOT NULL CHECK (created_cursor >= 0),
            recorded_at TEXT NOT NULL,
            payload_digest TEXT NOT NULL,
            record_digest TEXT NOT NULL,
            key_ref TEXT,                    -- NULL once the data key is destroyed
            envelope BYTEA,                  -- sealed candidate; NULL once terminal
            outcome TEXT                     -- JCS admission outcome once decided
        );
        CREATE TABLE records (
            record_id TEXT PRIMARY KEY,
            scope_ref TEXT NOT NULL,
            candidate_id TEXT NOT NULL,
            state TEXT NOT NULL,
            record_digest TEXT NOT NULL,
            payload_digest TEXT NOT NULL,
            recorded_cursor BIGINT NOT NULL CHECK (recorded_cursor >= 0),
            valid_t BIGINT NOT NULL,
            valid_t_end BIGINT,
            expires_at_ms BIGINT,
            key_ref TEXT,                    -- NULL once forgotten (crypto-shredded)
            body BYTEA,                      -- sealed record JCS; NULL once forgotten
            event_at BIGINT,                 -- primary_event.at: the event order search's rerank reads
            event_type TEXT                  -- primary_event.type_ref: whether a record is a turn
        );
        CREATE INDEX records_scope ON records (scope_ref, state);
        CREATE TABLE embeddings (
            record_id TEXT NOT NULL,
            model_digest TEXT NOT NULL,
            scope_ref TEXT NOT NULL,
            vector BYTEA NOT NULL,           -- sealed with the record's key
            PRIMARY KEY (record_id, model_digest)
        );
        CREATE TABLE tombstoned_payloads (
            scope_ref TEXT NOT NULL,
            payload_digest TEXT NOT NULL,
            record_id TEXT NOT NULL,
            cursor BIGINT NOT NULL CHECK (cursor >= 0),
            PRIMARY KEY (scope_ref, payload_digest, record_id)
        );
        CREATE TABLE idempotency (
            scope_ref TEXT NOT NULL,
            principal TEXT NOT NULL,
            key_digest TEXT NOT NULL,        -- SHA-256 of the key; the raw key is not kept
            tool TEXT NOT NULL,
            intent_hash TEXT NOT NULL,
            value TEXT NOT NULL,             -- JCS of the first success value, byte-exact
            created_at TEXT NOT NULL,
            PRIMARY KEY (scope_ref, principal, key_digest)
        );
        CREATE TABLE audit (
            audit_id TEXT PRIMARY KEY,
            called_at TEXT NOT NULL,
            scope_ref TEXT NOT NULL,
            principal TEXT NOT NULL,
            agent_id TEXT NOT NULL,
            session TEXT NOT NULL,
            tool TEXT NOT NULL,
            ok BOOLEAN NOT NULL,
            code TEXT,
            idk TEXT,
            context_jti TEXT                 -- the signed context's jti (HTTP); NULL over stdio
        );
        """,
    ),
    (
        2,
        "shared multi-node state: data keys, nodes, replay cache, store identity",
        """
        -- wrapped data keys live in rows (DuckDB kept them in files); destroying a key deletes its row
        CREATE TABLE data_keys (
            key_ref TEXT PRIMARY KEY,
            wrapped BYTEA NOT NULL
        );
        -- every serving node registers and heartbeats; a stale heartbeat marks a node gone
        CREATE TABLE nodes (
            node_id TEXT PRIMARY KEY,
            hostname TEXT NOT NULL,
            pid INTEGER NOT NULL,
            version TEXT NOT NULL,
            started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now()
        );
        -- a signed context's jti is accepted once until exp, on whichever node it reaches
        CREATE TABLE replay (
            kid TEXT NOT NULL,
            jti TEXT NOT NULL,
            exp BIGINT NOT NULL,             -- seconds since the epoch (the JWT claim)
            PRIMARY KEY (kid, jti)
        );
        CREATE INDEX replay_exp ON replay (exp);
        -- one row: which master key this store was created under (a node with another key refuses)
        CREATE TABLE store_identity (
            singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
            master_key_fingerprint TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        """,
    ),
    (
        3,
        "data keys carry their creation time; each node's projections acknowledge a scope's cursor",
        """
        -- the orphan sweep spares a key younger than a grace period: another node's open mutation
        ALTER TABLE data_keys ADD COLUMN created_at TIMESTAMPTZ NOT NULL DEFAULT now();
        -- how far each node's projections of a scope reflect its journal (a forget completes once
        -- every live node is past it)
        CREATE TABLE node_cursors (
            node_id TEXT NOT NULL,
            scope_ref TEXT NOT NULL,
            cursor BIGINT NOT NULL CHECK (cursor >= 0),
            PRIMARY KEY (node_id, scope_ref)
        );
        """,
    ),
    (
        4,
        "a pending withdraw or forget answer names the data key it still owes",
        """
        -- the key a withdraw/forget destroys, recorded with its "pending" answer: any node completes
        -- the answer only once this key's data_keys row is gone (NULL: no key was owed)
        ALTER TABLE idempotency ADD COLUMN key_ref TEXT;
        """,
    ),
    (
        5,
        "requests awaiting an operator's approval (clients without elicitation)",
        """
        CREATE TABLE approvals (
            request_id TEXT PRIMARY KEY,
            scope_ref TEXT NOT NULL,
            principal TEXT NOT NULL,
            agent_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            target TEXT NOT NULL,
            key_digest TEXT NOT NULL,        -- SHA-256 of the idempotency key; the raw key is sealed
            intent_hash TEXT NOT NULL,       -- the operation digest (the ledger's intent hash)
            context TEXT NOT NULL,           -- JCS of the bound host context
            key_ref TEXT,                    -- NULL once decided or expired (the arguments unreadable)
            arguments BYTEA,                 -- the call's arguments, sealed; NULL once decided
            status TEXT NOT NULL,            -- pending | approved | denied | expired
            created_at_ms BIGINT NOT NULL,
            expires_at_ms BIGINT NOT NULL,
            decided_at_ms BIGINT,
            reason TEXT,                     -- the operator's reason (screened for secrets)
            outcome TEXT,                    -- "ok" or the error code of the approved call
            UNIQUE (scope_ref, principal, key_digest)
        );
        """,
    ),
    (
        6,
        "records keep a keyed digest of the event type, never the agent-written type itself",
        """
        ALTER TABLE records ADD COLUMN IF NOT EXISTS event_kind TEXT;
        -- cleared before the drop, so no live tuple keeps a type; the node that applies this
        -- rewrites the table (VACUUM FULL records: REWRITE_AFTER) so no dead one does either
        UPDATE records SET event_type = NULL WHERE event_type IS NOT NULL;
        ALTER TABLE records DROP COLUMN IF EXISTS event_type;
        """,
    ),
]
# Tables a migration leaves dead tuples of plaintext in: rewritten (VACUUM FULL) once it is applied.
REWRITE_AFTER: dict[int, tuple[str, ...]] = {6: ("records",)}


def migration_digest(sql: str) -> str:
    return "sha256:" + hashlib.sha256(sql.encode()).hexdigest()


def migrate(conn: psycopg.Connection) -> list[int]:
    """Bring the database to the code's schema; refuse a ledger whose digests differ from the code's.
    Returns the versions this call applied.

    The caller passes a connection with no transaction open: the lock, the ledger check and every
    migration are one transaction, so a second node blocks on the lock, then finds them applied.
    A table named in ``REWRITE_AFTER`` for an applied version is then rewritten (VACUUM FULL, which
    cannot run inside the transaction)."""
    applied_now: list[int] = []
    if conn.info.transaction_status != pq.TransactionStatus.IDLE:
        raise RuntimeError("migrate needs a connection with no transaction open")
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [MIGRATE_LOCK_KEY])
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
            " digest TEXT NOT NULL, applied_at TEXT NOT NULL)"
        )
        rows = conn.execute("SELECT version, digest FROM schema_migrations").fetchall()
        applied = {version: digest for version, digest in rows}
        for version, name, sql in MIGRATIONS:
            digest = migration_digest(sql)
            if version in applied:
                if applied[version] != digest:
                    raise RuntimeError("migration ledger does not match the code (MIGRATION_LEDGER_INVALID)")
                continue
            conn.execute(sql.encode())  # several statements in one simple query (no parameters)
            conn.execute(
                "INSERT INTO schema_migrations VALUES (%s, %s, %s, %s)",
                [version, name, digest, to_instant(wall_clock())],
            )
            applied_now.append(version)
    rewrite = sorted({t for v in applied_now for t in REWRITE_AFTER.get(v, ())})
    if rewrite:
        autocommit = conn.autocommit
        conn.autocommit = True  # VACUUM runs outside any transaction
        try:
            for table in rewrite:
                conn.execute(f"VACUUM FULL {table}")
        finally:
            conn.autocommit = autocommit
    return applied_now
