"""The PostgreSQL backend of the store boundary (store/backend.py): one store shared by several nodes.

Each node holds a connection pool. Every statement outside a unit of work autocommits; a unit of
work is one transaction (READ COMMITTED) that takes a transaction-scoped advisory lock on its
scope the first time it names it, before it reads anything of the scope. So mutations of one
scope serialise across every node: the head read inside the lock is the true head (dense cursors,
one hash chain), and the idempotency ledger read after it holds every answer committed before,
so the same key sent to two nodes at once has one effect and both answer with the first result.

What DuckDB keeps in files lives in rows here, wrapped by the master key a node is started with
(never stored in PostgreSQL): data keys (``data_keys``), the page-cursor key (``meta``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from psycopg_pool import ConnectionPool

from engram_memory.models.canonical import canonical_text
from engram_memory.models.digests import ZERO_DIGEST, receipt_digest
from engram_memory.models.hostauth import CLOCK_LEEWAY_S
from engram_memory.store.backend import (
    APPROVAL_COLUMNS,
    EMBEDDING_MODEL_KEY,
    PROJECTED_OPERATIONS,
    RECORD_COLUMNS,
    Candidate,
    DueExpiry,
    JournalChange,
    KeyRing,
    LedgerEntry,
    LiveWindow,
    NewCandidate,
    NewRecord,
    PendingAnswer,
    RecordStatus,
    ReplayGuard,
    SealedRecord,
    StoreError,
    StoreRefused,
    journal_changes_of,
    names_record,
    register_store_errors,
)
from engram_memory.store.core.crypto import unwrap, wrap
from engram_memory.store.core.dirlock import lock_data_dir
from engram_memory.store.core.timeutil import to_instant, wall_clock
from engram_memory.store.postgres.schema import migrate

register_store_errors(psycopg.Error)

log = logging.getLogger("engram.store.postgres")

POOL_SIZE = 8  # connections per node: the engine's readers, its writer, the audit thread
CONNECT_TIMEOUT_S = 10.0
ORPHAN_KEY_GRACE = "10 minutes"  # a key younger than this may belong to another node's open mutation
SECRET_REF = "meta:page-cursor-key"  # the page-cursor key's wrapping is bound to this name
HEARTBEAT_S = 2.0
POLL_S = 5.0  # a node re-checks every scope this often, notified or not
NODE_LIVE_S = 10  # a node whose heartbeat is older is gone: a forget no longer waits for it
VACUUM_LOCK_TIMEOUT = "200ms"  # the longest a key load may queue behind the key table's vacuum
VACUUM_RETRY_S = 5.0  # a vacuum that did not get its lock runs again this much later
REPLAY_SKEW_S = 60  # how far a node's clock may trail the database's and still find a context claimed
REPLAY_HOLD_S = CLOCK_LEEWAY_S + REPLAY_SKEW_S  # a jti stays claimed until exp + this (database clock)


def fingerprint(master_key: bytes) -> str:
    """What the store records of its master key: enough to recognise it, nothing to open anything."""
    return "sha256:" + hashlib.sha256(b"engram-memory/master-key\0" + master_key).hexdigest()


def _scope_lock_key(scope_ref: str) -> int:
    digest = hashlib.sha256(b"engram-memory/scope\0" + scope_ref.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def connect_pool(url: str, size: int = POOL_SIZE) -> ConnectionPool:
    """A pool of autocommit connections; raises StoreError when PostgreSQL cannot be reached."""
    pool = ConnectionPool(url, min_size=1, max_size=size, kwargs={"autocommit": True},
                          name="engram-memory", open=False)
    try:
        pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
    except Exception as exc:  # psycopg_pool.PoolTimeout carries libpq's reason, never the URL's password
        pool.close()
        raise StoreRefused("cannot connect to the PostgreSQL store") from exc
    return pool


def init_store(url: str, master_key: bytes) -> str:
    """Create the schema and this store's identity under ``master_key``; returns the store id.

    Raises StoreRefused when the store is already initialised (nothing is changed then)."""
    pool = connect_pool(url, 1)
    try:
        with pool.connection() as conn:
            migrate(conn)
            with conn.transaction():
                conn.execute("LOCK TABLE store_identity IN EXCLUSIVE MODE")
                if conn.execute("SELECT 1 FROM store_identity").fetchone() is not None:
                    raise StoreRefused("the PostgreSQL store is already initialised")
                store_id = "store_" + secrets.token_hex(16)
                conn.execute("INSERT INTO store_identity VALUES (TRUE, %s, %s)",
                             [fingerprint(master_key), to_instant(wall_clock())])
                secret = wrap(AESGCM(master_key), SECRET_REF, secrets.token_bytes(32)).hex()
                values = [("store_id", store_id), ("storage_epoch", "0"), ("page_cursor_key", secret)]
                with conn.cursor() as cur:
                    cur.executemany("INSERT INTO meta VALUES (%s, %s)", values)
        return store_id
    finally:
        pool.close()


class PostgresStore:
    shared = True  # other nodes write the same store: caches are checked against its journal

    def __init__(self, url: str, master_key: bytes, data_dir: Path, *, key_file: Path | None = None) -> None:
        # The node's own directory (its projections and node id): one process at a time.
        self._lock_fd = lock_data_dir(data_dir)
        self.data_dir = data_dir
        try:
            self.pool = connect_pool(url)
        except BaseException:
            os.close(self._lock_fd)
            raise
        try:
            with self.pool.connection() as conn:
                migrate(conn)
                row = conn.execute("SELECT master_key_fingerprint FROM store_identity").fetchone()
                if row is None:
                    raise StoreRefused("the PostgreSQL store is not initialised (run: engram-memory admin init-store)")
                if row[0] != fingerprint(master_key):
                    named = f" {key_file}" if key_file is not None else ""
                    raise StoreRefused(f"the master key file{named} is not this store's master key")
                # Each node's open is a new storage epoch, as each open of a DuckDB store is.
                epoch = conn.execute(
                    "UPDATE meta SET value = (value::bigint + 1)::text WHERE key = 'storage_epoch' RETURNING value"
                ).fetchone()
                assert epoch is not None
                self.storage_epoch = str(epoch[0])
        except BaseException:
            self.pool.close()
            os.close(self._lock_fd)
            raise
        self._master = AESGCM(master_key)
        self.fingerprint = fingerprint(master_key)
        self.node_id = _node_id(data_dir)
        _bind_node_dir(data_dir, self.store_id())
        self._url = url
        self._stop = threading.Event()
        self.keys_destroyed = threading.Event()  # set by the key ring; the vacuum thread then runs
        self._watcher: threading.Thread | None = None
        self._clock_offset_ms = 0
        self._beat()
        self._heart = threading.Thread(target=self._heartbeat, name="engram-heartbeat", daemon=True)
        self._heart.start()
        self._vacuum = threading.Thread(target=self._vacuum_loop, name="engram-vacuum-keys", daemon=True)
        self._vacuum.start()

    def watch(self, on_change: Callable[[str], None]) -> None:
        """Call ``on_change(scope_ref)`` from a background thread whenever another node moves a
        scope's projection cursor (LISTEN/NOTIFY), and for every scope every ``POLL_S`` seconds,
        so a missed notification (a dropped connection) only delays a node, never strands it."""
        self._watcher = threading.Thread(target=self._watch, args=(on_change,), name="engram-watch", daemon=True)
        self._watcher.start()

    def _watch(self, on_change: Callable[[str], None]) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._url, autocommit=True) as conn:
                    conn.execute("LISTEN engram_journal")
                    for scope_ref in self.scopes():  # whatever happened while not listening
                        on_change(scope_ref)
                    polled = time.monotonic()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.25):  # short: close() waits for this thread
                            on_change(note.payload)
                        if time.monotonic() - polled >= POLL_S:
                            polled = time.monotonic()
                            for scope_ref in self.scopes():
                                on_change(scope_ref)
            except Exception:  # noqa: BLE001 - reconnect after a pause; reads check the journal anyway
                log.warning("watching the PostgreSQL journal failed; retrying", exc_info=True)
                self._stop.wait(POLL_S)

    def close(self) -> None:
        if self._stop.is_set():
            return  # closed already
        self._stop.set()
        self._heart.join()
        self._vacuum.join()
        if self._watcher is not None:
            self._watcher.join()
        try:
            self.one("DELETE FROM nodes WHERE node_id = %s RETURNING 1", [self.node_id])
        except psycopg.Error:
            pass  # gone from the store's view once its heartbeat ages anyway
        finally:
            self.pool.close()
            os.close(self._lock_fd)

    def _beat(self) -> None:
        sent = wall_clock()
        row = self.one(
            "INSERT INTO nodes (node_id, hostname, pid, version) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (node_id) DO UPDATE SET heartbeat_at = now(), pid = excluded.pid"
            " RETURNING (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            [self.node_id, socket.gethostname(), os.getpid(), _version()],
        )
        assert row is not None
        # The database's clock against this node's, measured at each heartbeat (error: half the
        # round trip): what clock() adds to this node's wall clock.
        self._clock_offset_ms = int(row[0]) - (sent + wall_clock()) // 2

    def clock(self) -> int | None:
        """The database's clock (epoch ms), read without a round trip: this node's wall clock
        corrected by the offset the last heartbeat measured. Every node expires a record, and
        judges a signed context's replay, by this one clock, however far its own has drifted."""
        return wall_clock() + self._clock_offset_ms

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._beat()
            except Exception:  # noqa: BLE001 - the store is unreachable: reads fail on their own; keep trying
                log.warning("heartbeat to the PostgreSQL store failed")

    # -- bounding what a deleted key leaves behind (SECURITY.md) ---------------------------

    def _vacuum_loop(self) -> None:
        """After key destructions, on a thread of its own (never the heartbeat's): vacuum
        ``data_keys``; when its lock is not granted at once, retry VACUUM_RETRY_S later."""
        while not self._stop.is_set():
            if not self.keys_destroyed.wait(0.25):  # short: close() joins this thread
                continue
            self.keys_destroyed.clear()
            try:
                self.vacuum_keys()
            except Exception:  # noqa: BLE001 - a reader holds the table (a backup) or the store is away
                log.info("vacuuming data_keys did not get its lock; retried in %.0f s", VACUUM_RETRY_S)
                if not self._stop.wait(VACUUM_RETRY_S):
                    self.keys_destroyed.set()

    def vacuum_keys(self) -> None:
        """Rewrite ``data_keys`` without its dead rows. A deleted row stays in the table's file as a
        dead tuple, and a plain VACUUM only marks its space free (the bytes stay until reused);
        VACUUM FULL writes a new file holding the live rows only. The table is small (one ~60-byte
        row per live candidate or record), so its brief exclusive lock costs milliseconds.

        It waits at most VACUUM_LOCK_TIMEOUT for that lock, then raises: while it waits, every
        reader of ``data_keys`` (each key load) queues behind it, and a long transaction that read
        the table (pg_dump's REPEATABLE READ) would otherwise stall the whole cluster."""
        with self.pool.connection() as conn:  # autocommit: VACUUM cannot run inside a transaction
            conn.execute(f"SET lock_timeout = '{VACUUM_LOCK_TIMEOUT}'")
            try:
                conn.execute("VACUUM FULL data_keys")
            finally:
                conn.execute("RESET lock_timeout")

    def bound_memory(self, mib: int) -> None:
        return None  # the cache is the PostgreSQL server's

    def key_ring(self) -> KeyRing:
        return PostgresKeyRing(self)

    def replay_guard(self) -> ReplayGuard:
        return PostgresReplay(self)

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        with self.pool.connection() as conn:
            return conn.execute(sql, params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.pool.connection() as conn:
            return conn.execute(sql, params).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[PostgresUnitOfWork]:
        with self.pool.connection() as conn, conn.transaction():
            yield PostgresUnitOfWork(self, conn)

    # -- journal -------------------------------------------------------------------------

    def projection_cursor(self, scope_ref: str) -> int:
        row = self.one("SELECT projection_cursor FROM scopes WHERE scope_ref = %s", [scope_ref])
        return int(row[0]) if row else 0

    def projection_cursors(self) -> dict[str, int]:
        return {s: int(c) for s, c in self.all("SELECT scope_ref, projection_cursor FROM scopes")}

    def scopes(self) -> list[str]:
        return [r[0] for r in self.all("SELECT scope_ref FROM scopes ORDER BY scope_ref")]

    def high_water(self, scope_ref: str) -> int:
        row = self.one("SELECT high_water FROM scopes WHERE scope_ref = %s", [scope_ref])
        return int(row[0]) if row else 0

    def verify_journal(self, scope_ref: str) -> bool:
        previous, expected = ZERO_DIGEST, 1
        with self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT cursor, body, event_hash FROM journal WHERE scope_ref = %s ORDER BY cursor", [scope_ref]
            )
            for cursor, body, event_hash in rows:
                event = json.loads(body)
                if int(cursor) != expected or event["previous_event_hash"] != previous:
                    return False
                if receipt_digest("memory-journal-event", event, "event_hash") != event_hash:
                    return False
                previous, expected = event_hash, expected + 1
        return True

    def journal_changes(self, scope_ref: str, after: int, through: int) -> list[JournalChange]:
        return journal_changes_of(self.all(
            "SELECT cursor, operation, body FROM journal WHERE scope_ref = %s"
            " AND cursor > %s AND cursor <= %s AND operation = ANY(%s) ORDER BY cursor",
            [scope_ref, after, through, list(PROJECTED_OPERATIONS)],
        ))

    def record_events(self, scope_ref: str, record_id: str) -> list[dict[str, Any]]:
        # A substring match finds the candidates; the parsed body must name the record itself.
        rows = self.all("SELECT body FROM journal WHERE scope_ref = %s AND strpos(body, %s) > 0 ORDER BY cursor",
                        [scope_ref, record_id])
        return names_record([json.loads(body) for (body,) in rows], record_id)

    def record_scope(self, record_id: str) -> str | None:
        row = self.one("SELECT scope_ref FROM records WHERE record_id = %s", [record_id])
        return row[0] if row else None

    def record_principals(self, scope_ref: str, state: str) -> dict[str, str]:
        return {rid: p for rid, p in self.all(
            "SELECT r.record_id, c.principal FROM records r JOIN candidates c USING (candidate_id)"
            " WHERE r.scope_ref = %s AND r.state = %s", [scope_ref, state])}

    # -- ledger --------------------------------------------------------------------------

    def ledger_lookup(self, scope_ref: str, principal: str, key_digest: str) -> LedgerEntry | None:
        with self.pool.connection() as conn:
            return _ledger_lookup(conn, scope_ref, principal, key_digest)

    def ledger_update(self, scope_ref: str, principal: str, key_digest: str, value: str) -> None:
        with self.pool.connection() as conn:
            _ledger_update(conn, scope_ref, principal, key_digest, value)

    def pending_answers(self, scope_ref: str | None = None) -> list[PendingAnswer]:
        sql = ("SELECT scope_ref, tool, principal, key_digest, value FROM idempotency"
               " WHERE ((tool = 'withdraw' AND strpos(value, '\"key_destruction\":\"pending\"') > 0)"
               " OR (tool = 'forget' AND strpos(value, '\"projection_invalidation\":\"pending\"') > 0))")
        params: list[Any] = []
        if scope_ref is not None:
            sql += " AND scope_ref = %s"
            params.append(scope_ref)
        rows = self.all(sql + " ORDER BY 1, 3, 4", params)
        return [PendingAnswer(s, t, p, k, json.loads(v)) for s, t, p, k, v in rows]

    def owed_keys(self, scope_ref: str) -> list[str]:
        """The data keys the scope's pending withdraw/forget answers still owe: recorded with each
        answer, their rows still present (a node died, or its delete failed, after the commit)."""
        return [r[0] for r in self.all(
            "SELECT DISTINCT i.key_ref FROM idempotency i JOIN data_keys d USING (key_ref)"
            " WHERE i.scope_ref = %s AND (strpos(i.value, '\"key_destruction\":\"pending\"') > 0"
            " OR strpos(i.value, '\"projection_invalidation\":\"pending\"') > 0) ORDER BY 1",
            [scope_ref])]

    # -- lifecycle state -----------------------------------------------------------------

    def candidate(self, candidate_id: str, scope_ref: str | None) -> Candidate | None:
        with self.pool.connection() as conn:
            return _candidate(conn, candidate_id, scope_ref)

    def candidate_count(self, scope_ref: str) -> int:
        row = self.one("SELECT count(*) FROM candidates WHERE scope_ref = %s", [scope_ref])
        return int(row[0]) if row else 0

    def record_state(self, scope_ref: str, record_id: str) -> RecordStatus | None:
        with self.pool.connection() as conn:
            return _record_state(conn, scope_ref, record_id)

    def tombstoned(self, scope_ref: str, payload_digest: str) -> bool:
        with self.pool.connection() as conn:
            return _tombstoned(conn, scope_ref, payload_digest)

    def due_expiries(self, scope_ref: str, states: Sequence[str], now_ms: int) -> list[DueExpiry]:
        with self.pool.connection() as conn:
            return _due_expiries(conn, scope_ref, states, now_ms)

    # -- records (sealed) ----------------------------------------------------------------

    def referenced_keys(self) -> set[str]:
        return {r[0] for r in self.all(
            "SELECT key_ref FROM candidates WHERE key_ref IS NOT NULL"
            " UNION SELECT key_ref FROM records WHERE key_ref IS NOT NULL"
            " UNION SELECT key_ref FROM approvals WHERE key_ref IS NOT NULL"
        )}

    def current_records(self, scope_ref: str, state: str) -> list[SealedRecord]:
        return [SealedRecord(rid, scope_ref, key_ref, bytes(body)) for rid, key_ref, body in self.all(
            "SELECT record_id, key_ref, body FROM records WHERE scope_ref = %s AND state = %s ORDER BY record_id",
            [scope_ref, state],
        )]

    def record_payload_digests(self, scope_ref: str, state: str) -> set[str]:
        return {d for (d,) in self.all("SELECT payload_digest FROM records WHERE scope_ref = %s AND state = %s",
                                       [scope_ref, state])}

    def missing_embeddings(self, scope_ref: str, state: str, model_digest: str | None,
                           limit: int) -> list[SealedRecord]:
        return [SealedRecord(rid, scope_ref, key_ref, bytes(body)) for rid, key_ref, body in self.all(
            "SELECT record_id, key_ref, body FROM records r WHERE scope_ref = %s AND state = %s"
            " AND NOT EXISTS (SELECT 1 FROM embeddings e WHERE e.record_id = r.record_id"
            " AND e.model_digest = %s) ORDER BY record_id LIMIT %s",
            [scope_ref, state, model_digest, limit],
        )]

    def load_records(self, record_ids: Sequence[str]) -> list[SealedRecord]:
        # Forgotten records (no body) are left out: the engine treats them as absent either way.
        return [SealedRecord(rid, scope, key_ref, bytes(body)) for rid, scope, key_ref, body in self.all(
            "SELECT record_id, scope_ref, key_ref, body FROM records WHERE record_id = ANY(%s) AND body IS NOT NULL",
            [list(record_ids)])]

    def live_windows(self, scope_ref: str, state: str) -> list[LiveWindow]:
        return [LiveWindow(*row) for row in self.all(
            "SELECT record_id, valid_t, valid_t_end, expires_at_ms, event_at, event_kind FROM records"
            " WHERE scope_ref = %s AND state = %s",
            [scope_ref, state],
        )]

    # -- stored embeddings ---------------------------------------------------------------

    def stored_embeddings(self, scope_ref: str, state: str,
                          model_digest: str | None) -> list[tuple[str, str, bytes]]:
        return [(rid, key_ref, bytes(blob)) for rid, key_ref, blob in self.all(
            "SELECT e.record_id, r.key_ref, e.vector FROM embeddings e JOIN records r USING (record_id)"
            " WHERE e.scope_ref = %s AND e.model_digest = %s AND r.state = %s ORDER BY e.record_id",
            [scope_ref, model_digest, state],
        )]

    def embeddings_of(self, record_ids: Sequence[str], model_digest: str | None) -> dict[str, tuple[str, bytes]]:
        return {rid: (key_ref, bytes(blob)) for rid, key_ref, blob in self.all(
            "SELECT e.record_id, r.key_ref, e.vector FROM embeddings e JOIN records r USING (record_id)"
            " WHERE e.record_id = ANY(%s) AND e.model_digest = %s AND r.key_ref IS NOT NULL",
            [list(record_ids), model_digest],
        )}

    def stored_embedding_count(self, scope_ref: str, state: str, model_digest: str | None) -> int:
        row = self.one(
            "SELECT count(*) FROM embeddings e JOIN records r USING (record_id)"
            " WHERE e.scope_ref = %s AND e.model_digest = %s AND r.state = %s",
            [scope_ref, model_digest, state],
        )
        return int(row[0]) if row else 0

    def embedding_count(self, record_id: str | None = None) -> int:
        if record_id is None:
            row = self.one("SELECT count(*) FROM embeddings")
        else:
            row = self.one("SELECT count(*) FROM embeddings WHERE record_id = %s", [record_id])
        return int(row[0]) if row else 0

    # -- identity, copies, audit ---------------------------------------------------------

    def embedding_model(self) -> str | None:
        """The embedding model the store was created with (``meta.embedding_model``; store/models.py)."""
        row = self.one("SELECT value FROM meta WHERE key = %s", [EMBEDDING_MODEL_KEY])
        return str(row[0]) if row else None

    def record_embedding_model(self, value: str) -> None:
        with self.pool.connection() as conn, conn.transaction():
            conn.execute("INSERT INTO meta VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                         [EMBEDDING_MODEL_KEY, value])

    def store_id(self) -> str:
        row = self.one("SELECT value FROM meta WHERE key = 'store_id'")
        assert row is not None, "init_store writes the store id"
        return str(row[0])

    def heads(self) -> dict[str, tuple[int, str]]:
        return {scope: (int(hw), h) for scope, hw, h in
                self.all("SELECT scope_ref, high_water, last_event_hash FROM scopes ORDER BY scope_ref")}

    def copy_to(self, path: Path) -> None:
        raise StoreError("a PostgreSQL store is backed up with PostgreSQL's own tools (pg_dump, base backups)")

    def console_rows(self, query: str, params: list[Any]) -> list[tuple[Any, ...]]:
        from engram_memory.store.postgres.console import rows

        return rows(self, query, params)

    def append_audit(self, rows: Sequence[Sequence[Any]]) -> None:
        with self.pool.connection() as conn, conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO audit (audit_id, called_at, scope_ref, principal, agent_id, session, tool, ok, code,"
                " idk, context_jti) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [list(row) for row in rows],
            )

    # -- requests awaiting an operator's approval ---------------------------------------------

    def approval_insert(self, row: Sequence[Any]) -> bool:
        return self._approval_write(
            f"INSERT INTO approvals ({', '.join(APPROVAL_COLUMNS)})"
            f" VALUES ({', '.join(['%s'] * len(APPROVAL_COLUMNS))}) ON CONFLICT DO NOTHING RETURNING request_id",
            list(row))

    def approval_find(self, scope_ref: str, principal: str, key_digest: str) -> tuple[Any, ...] | None:
        return self._approval_row(f"SELECT {', '.join(APPROVAL_COLUMNS)} FROM approvals"
                                  " WHERE scope_ref = %s AND principal = %s AND key_digest = %s",
                                  [scope_ref, principal, key_digest])

    def approval_get(self, request_id: str) -> tuple[Any, ...] | None:
        return self._approval_row(f"SELECT {', '.join(APPROVAL_COLUMNS)} FROM approvals WHERE request_id = %s",
                                  [request_id])

    def approvals_pending(self, scope_ref: str | None) -> list[tuple[Any, ...]]:
        sql = f"SELECT {', '.join(APPROVAL_COLUMNS)} FROM approvals WHERE status = 'pending'"
        params: list[Any] = []
        if scope_ref is not None:
            sql += " AND scope_ref = %s"
            params.append(scope_ref)
        return [_approval_tuple(r) for r in self.all(sql + " ORDER BY created_at_ms, request_id", params)]

    def approval_decide(self, request_id: str, status: str, decided_at_ms: int, reason: str) -> bool:
        return self._approval_write(
            "UPDATE approvals SET status = %s, decided_at_ms = %s, reason = %s, key_ref = NULL, arguments = NULL"
            " WHERE request_id = %s AND status = 'pending' RETURNING request_id",
            [status, decided_at_ms, reason, request_id])

    def approval_outcome(self, request_id: str, outcome: str) -> None:
        self._approval_write("UPDATE approvals SET outcome = %s WHERE request_id = %s RETURNING request_id",
                             [outcome, request_id])

    def _approval_row(self, sql: str, params: list[Any]) -> tuple[Any, ...] | None:
        row = self.one(sql, params)
        return None if row is None else _approval_tuple(row)

    def _approval_write(self, sql: str, params: list[Any]) -> bool:
        with self.pool.connection() as conn:
            return conn.execute(sql, params).fetchone() is not None

    # -- nodes ---------------------------------------------------------------------------

    def acknowledge(self, scope_ref: str, cursor: int) -> None:
        self.one("INSERT INTO node_cursors VALUES (%s, %s, %s) ON CONFLICT (node_id, scope_ref)"
                 " DO UPDATE SET cursor = excluded.cursor RETURNING 1", [self.node_id, scope_ref, cursor])

    def unacknowledged(self, scope_ref: str, cursor: int) -> int:
        row = self.one(
            "SELECT count(*) FROM node_cursors c JOIN nodes n USING (node_id) WHERE c.scope_ref = %s"
            " AND c.cursor < %s AND n.heartbeat_at > now() - %s::interval",
            [scope_ref, cursor, f"{NODE_LIVE_S} seconds"],
        )
        return int(row[0]) if row else 0

    # -- the page-cursor key -------------------------------------------------------------

    def page_cursor_key(self) -> bytes:
        row = self.one("SELECT value FROM meta WHERE key = 'page_cursor_key'")
        if row is None:
            raise StoreRefused("the PostgreSQL store has no page-cursor key (run: engram-memory admin init-store)")
        return unwrap(self._master, SECRET_REF, bytes.fromhex(row[0]))


def _version() -> str:
    from importlib.metadata import version

    return version("engram-memory")


def _bind_node_dir(data_dir: Path, store_id: str) -> None:
    """A node's directory caches one store: projections built from another store (re-initialised or
    replaced under the same URL) are discarded, and rebuilt from this one on first use."""
    path = data_dir / "store.id"
    try:
        known = path.read_text().strip()
    except FileNotFoundError:
        known = None
    if known != store_id:
        if known is not None or (data_dir / "projections").exists():
            shutil.rmtree(data_dir / "projections", ignore_errors=True)
            log.warning("node directory %s held another store's projections: discarded", data_dir)
        path.write_text(store_id + "\n")


def _node_id(data_dir: Path) -> str:
    """This node's id, kept in its data dir (a new directory is a new node)."""
    path = data_dir / "node.id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        node = "node_" + secrets.token_hex(8)
        path.write_text(node + "\n")
        return node


# -- statements shared by the store and its units of work ----------------------------------


def _ledger_lookup(conn: psycopg.Connection, scope_ref: str, principal: str, key_digest: str) -> LedgerEntry | None:
    row = conn.execute(
        "SELECT intent_hash, value FROM idempotency WHERE scope_ref = %s AND principal = %s AND key_digest = %s",
        [scope_ref, principal, key_digest],
    ).fetchone()
    return LedgerEntry(row[0], row[1]) if row else None


def _ledger_update(conn: psycopg.Connection, scope_ref: str, principal: str, key_digest: str, value: str) -> None:
    # Only a "pending" answer is ever upgraded, once: when two nodes complete it at the same time (with
    # coverage digests of different cursors), the first completion is the answer for good. And never
    # while the data key it owes still has its row, whichever node left the row behind.
    conn.execute(
        "UPDATE idempotency SET value = %s WHERE scope_ref = %s AND principal = %s AND key_digest = %s"
        " AND (strpos(value, '\"key_destruction\":\"pending\"') > 0"
        " OR strpos(value, '\"projection_invalidation\":\"pending\"') > 0)"
        " AND (key_ref IS NULL OR NOT EXISTS (SELECT 1 FROM data_keys d WHERE d.key_ref = idempotency.key_ref))",
        [value, scope_ref, principal, key_digest],
    )


def _candidate(conn: psycopg.Connection, candidate_id: str, scope_ref: str | None) -> Candidate | None:
    sql = ("SELECT scope_ref, state, created_cursor, recorded_at, key_ref, envelope, outcome, payload_digest"
           " FROM candidates WHERE candidate_id = %s")
    params: list[Any] = [candidate_id]
    if scope_ref is not None:
        sql += " AND scope_ref = %s"
        params.append(scope_ref)
    row = conn.execute(sql, params).fetchone()
    if row is None:
        return None
    s, state, created, at, key_ref, envelope, outcome, pd = row
    return Candidate(s, state, int(created), at, key_ref, bytes(envelope) if envelope is not None else None,
                     outcome, pd)


def _record_state(conn: psycopg.Connection, scope_ref: str, record_id: str) -> RecordStatus | None:
    row = conn.execute(
        "SELECT state, key_ref, payload_digest FROM records WHERE record_id = %s AND scope_ref = %s",
        [record_id, scope_ref],
    ).fetchone()
    return RecordStatus(*row) if row else None


def _tombstoned(conn: psycopg.Connection, scope_ref: str, payload_digest: str) -> bool:
    return conn.execute(
        "SELECT 1 FROM tombstoned_payloads WHERE scope_ref = %s AND payload_digest = %s LIMIT 1",
        [scope_ref, payload_digest],
    ).fetchone() is not None


def _due_expiries(conn: psycopg.Connection, scope_ref: str, states: Sequence[str], now_ms: int) -> list[DueExpiry]:
    return [DueExpiry(rid, state, rd, int(exp)) for rid, state, rd, exp in conn.execute(
        "SELECT record_id, state, record_digest, expires_at_ms FROM records WHERE scope_ref = %s"
        " AND state = ANY(%s) AND expires_at_ms <= %s ORDER BY record_id",
        [scope_ref, list(states), now_ms],
    ).fetchall()]


class PostgresUnitOfWork:
    """One open transaction (store/backend.py ``UnitOfWork``); a scope is locked when first named."""

    def __init__(self, store: PostgresStore, conn: psycopg.Connection) -> None:
        self._store = store
        self._conn = conn
        self._locked: set[str] = set()

    def _lock(self, scope_ref: str) -> psycopg.Connection:
        if scope_ref not in self._locked:
            # Held to the end of the transaction: every node's writer of this scope waits here, so
            # what it reads next (head, ledger, states) is what the previous writer committed.
            self._conn.execute("SELECT pg_advisory_xact_lock(%s)", [_scope_lock_key(scope_ref)])
            self._locked.add(scope_ref)
        return self._conn

    def high_water(self, scope_ref: str) -> int:
        row = self._lock(scope_ref).execute(
            "SELECT high_water FROM scopes WHERE scope_ref = %s", [scope_ref]).fetchone()
        return int(row[0]) if row else 0

    def append_event(self, scope_ref: str, event: dict[str, Any],
                     advance_projection: bool = False) -> dict[str, Any]:
        conn = self._lock(scope_ref)
        row = conn.execute("SELECT high_water, last_event_hash FROM scopes WHERE scope_ref = %s",
                           [scope_ref]).fetchone()
        if row is None:
            conn.execute("INSERT INTO scopes VALUES (%s, 0, %s, 0)", [scope_ref, ZERO_DIGEST])
            head: tuple[int, str] = (0, ZERO_DIGEST)
        else:
            head = (int(row[0]), row[1])
        cursor = head[0] + 1
        body = {"schema_version": 1, **event, "cursor": str(cursor), "previous_event_hash": head[1]}
        body["event_hash"] = receipt_digest("memory-journal-event", body, "event_hash")
        conn.execute(
            "INSERT INTO journal VALUES (%s, %s, %s, %s, %s, %s)",
            [scope_ref, cursor, body["event_id"], body["operation"], canonical_text(body), body["event_hash"]],
        )
        if advance_projection:
            conn.execute(
                "UPDATE scopes SET high_water = %s, last_event_hash = %s, projection_cursor = %s WHERE scope_ref = %s",
                [cursor, body["event_hash"], cursor, scope_ref],
            )
            conn.execute("SELECT pg_notify('engram_journal', %s)", [scope_ref])
        else:
            conn.execute("UPDATE scopes SET high_water = %s, last_event_hash = %s WHERE scope_ref = %s",
                         [cursor, body["event_hash"], scope_ref])
        return body

    def set_projection_cursor(self, scope_ref: str, cursor: int) -> None:
        conn = self._lock(scope_ref)
        conn.execute("UPDATE scopes SET projection_cursor = %s WHERE scope_ref = %s", [cursor, scope_ref])
        conn.execute("SELECT pg_notify('engram_journal', %s)", [scope_ref])

    def ledger_lookup(self, scope_ref: str, principal: str, key_digest: str) -> LedgerEntry | None:
        return _ledger_lookup(self._lock(scope_ref), scope_ref, principal, key_digest)

    def candidate(self, candidate_id: str, scope_ref: str | None) -> Candidate | None:
        conn = self._lock(scope_ref) if scope_ref is not None else self._conn
        return _candidate(conn, candidate_id, scope_ref)

    def record_state(self, scope_ref: str, record_id: str) -> RecordStatus | None:
        return _record_state(self._lock(scope_ref), scope_ref, record_id)

    def tombstoned(self, scope_ref: str, payload_digest: str) -> bool:
        return _tombstoned(self._lock(scope_ref), scope_ref, payload_digest)

    def due_expiries(self, scope_ref: str, states: Sequence[str], now_ms: int) -> list[DueExpiry]:
        return _due_expiries(self._lock(scope_ref), scope_ref, states, now_ms)

    def ledger_store(self, scope_ref: str, principal: str, key_digest: str, tool: str, intent_hash: str,
                     value: str, created_at: str, key_ref: str | None = None) -> None:
        self._lock(scope_ref).execute(
            "INSERT INTO idempotency (scope_ref, principal, key_digest, tool, intent_hash, value, created_at,"
            " key_ref) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [scope_ref, principal, key_digest, tool, intent_hash, value, created_at, key_ref],
        )

    def ledger_update(self, scope_ref: str, principal: str, key_digest: str, value: str) -> None:
        _ledger_update(self._lock(scope_ref), scope_ref, principal, key_digest, value)

    def insert_candidate(self, c: NewCandidate) -> None:
        self._lock(c.scope_ref).execute(
            "INSERT INTO candidates VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, NULL)",
            [c.candidate_id, c.scope_ref, c.principal, c.state, c.created_cursor, c.recorded_at, c.payload_digest,
             c.record_digest, c.key_ref, c.envelope],
        )

    def close_candidate(self, candidate_id: str, state: str, outcome: str | None = None) -> None:
        if outcome is None:
            self._conn.execute(
                "UPDATE candidates SET state = %s, key_ref = NULL, envelope = NULL WHERE candidate_id = %s",
                [state, candidate_id],
            )
        else:
            self._conn.execute(
                "UPDATE candidates SET state = %s, key_ref = NULL, envelope = NULL, outcome = %s"
                " WHERE candidate_id = %s",
                [state, outcome, candidate_id],
            )

    def insert_record(self, r: NewRecord) -> None:
        self._lock(r.scope_ref).execute(
            f"INSERT INTO records ({', '.join(RECORD_COLUMNS)}) VALUES ({', '.join(['%s'] * len(RECORD_COLUMNS))})",
            [r.record_id, r.scope_ref, r.candidate_id, r.state, r.record_digest, r.payload_digest,
             r.recorded_cursor, r.valid_t, r.valid_t_end, r.expires_at_ms, r.key_ref, r.body,
             r.event_at, r.event_kind],
        )

    def set_record_state(self, record_id: str, state: str) -> None:
        self._conn.execute("UPDATE records SET state = %s WHERE record_id = %s", [state, record_id])

    def tombstone_record(self, record_id: str, state: str) -> None:
        self._conn.execute(
            "UPDATE records SET state = %s, key_ref = NULL, body = NULL, event_kind = NULL WHERE record_id = %s",
            [state, record_id],
        )

    def delete_embeddings(self, record_id: str) -> None:
        self._conn.execute("DELETE FROM embeddings WHERE record_id = %s", [record_id])

    def tombstone_payload(self, scope_ref: str, payload_digest: str, record_id: str, cursor: int) -> None:
        self._lock(scope_ref).execute("INSERT INTO tombstoned_payloads VALUES (%s, %s, %s, %s)",
                                      [scope_ref, payload_digest, record_id, cursor])

    # -- a batch in one transaction (an import): the same statements, one commit for the batch --

    def ledger_lookup_many(self, scope_ref: str, principal: str, key_digests: Sequence[str]
                           ) -> dict[str, LedgerEntry]:
        return {kd: LedgerEntry(intent, value) for kd, intent, value in self._lock(scope_ref).execute(
            "SELECT key_digest, intent_hash, value FROM idempotency WHERE scope_ref = %s AND principal = %s"
            " AND key_digest = ANY(%s)",
            [scope_ref, principal, list(key_digests)],
        ).fetchall()}

    def tombstoned_many(self, scope_ref: str, payload_digests: Sequence[str]) -> set[str]:
        return {pd for (pd,) in self._lock(scope_ref).execute(
            "SELECT DISTINCT payload_digest FROM tombstoned_payloads WHERE scope_ref = %s AND payload_digest = ANY(%s)",
            [scope_ref, list(payload_digests)],
        ).fetchall()}

    def append_events(self, scope_ref: str, events: Sequence[tuple[dict[str, Any], bool]]) -> list[dict[str, Any]]:
        return [self.append_event(scope_ref, event, advance) for event, advance in events]

    def insert_candidates(self, candidates: Sequence[NewCandidate], outcomes: Sequence[str | None]) -> None:
        for c, outcome in zip(candidates, outcomes, strict=True):
            self._lock(c.scope_ref).execute(
                "INSERT INTO candidates VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [c.candidate_id, c.scope_ref, c.principal, c.state, c.created_cursor, c.recorded_at,
                 c.payload_digest, c.record_digest, c.key_ref, c.envelope, outcome],
            )

    def insert_records(self, records: Sequence[NewRecord]) -> None:
        for r in records:
            self.insert_record(r)

    def ledger_store_many(self, scope_ref: str, principal: str,
                          rows: Sequence[tuple[str, str, str, str, str]]) -> None:
        for key_digest, tool, intent_hash, value, created_at in rows:
            self.ledger_store(scope_ref, principal, key_digest, tool, intent_hash, value, created_at)

    def live_keys(self, scope_ref: str, record_ids: Sequence[str], state: str) -> list[tuple[str, str]]:
        # Under the scope's lock: a forget of one of them waits for this transaction's embeddings,
        # then deletes them with the record's key (read without it, the forget could commit in
        # between and the insert leave an embeddings row for a tombstoned record).
        return [(rid, key_ref) for rid, key_ref in self._lock(scope_ref).execute(
            "SELECT record_id, key_ref FROM records WHERE record_id = ANY(%s) AND scope_ref = %s AND state = %s"
            " AND key_ref IS NOT NULL ORDER BY record_id",
            [list(record_ids), scope_ref, state],
        ).fetchall()]

    def insert_embeddings(self, rows: Sequence[tuple[str, str | None, str, bytes]]) -> None:
        if rows:
            with self._conn.cursor() as cur:
                cur.executemany("INSERT INTO embeddings VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                                [list(row) for row in rows])


class PostgresKeyRing:
    """Data keys in ``data_keys`` rows, wrapped by the node's master key. A key is created in its
    own commit before the mutation that references it and deleted after the one that drops it,
    exactly like DuckDB's key files, so a crash in between leaves an orphan the sweep removes."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        self.server_secret = store.page_cursor_key()

    def create(self) -> tuple[str, bytes]:
        key_ref = "local:key-" + secrets.token_hex(12)
        dek = AESGCM.generate_key(bit_length=256)
        # Only while the store is still under this node's master key: after a rotation a node started
        # with the old key must not add keys nobody could unwrap.
        inserted = self._store.one(
            "INSERT INTO data_keys (key_ref, wrapped) SELECT %s, %s WHERE EXISTS"
            " (SELECT 1 FROM store_identity WHERE master_key_fingerprint = %s) RETURNING 1",
            [key_ref, wrap(self._store._master, key_ref, dek), self._store.fingerprint])
        if inserted is None:
            raise StoreError("the store's master key changed (rotated): restart this node with the new key file")
        return key_ref, dek

    def create_many(self, count: int) -> list[tuple[str, bytes]]:
        return [self.create() for _ in range(count)]  # each its own commit, before the batch's

    def load(self, key_ref: str) -> bytes | None:
        row = self._store.one("SELECT wrapped FROM data_keys WHERE key_ref = %s", [key_ref])
        if row is None:
            return None
        try:
            return unwrap(self._store._master, key_ref, bytes(row[0]))
        except InvalidTag as exc:
            raise StoreError("a data key does not open under this node's master key") from exc

    def destroy(self, key_ref: str) -> bool:
        try:
            deleted = self._store.one("DELETE FROM data_keys WHERE key_ref = %s RETURNING 1", [key_ref])
        except psycopg.Error:
            log.exception("a data key could not be deleted")
            return False
        if deleted is not None:
            self._store.keys_destroyed.set()
        return True

    def key_refs(self) -> list[str]:
        return [r[0] for r in self._store.all("SELECT key_ref FROM data_keys ORDER BY key_ref")]

    def sweep_orphans(self, referenced: set[str]) -> int:
        # Decided in one statement against the rows themselves (not ``referenced``, read earlier): a key
        # another node created for a mutation still open is younger than the grace and stays.
        rows = self._store.all(
            "DELETE FROM data_keys d WHERE d.created_at < now() - %s::interval"
            " AND NOT EXISTS (SELECT 1 FROM candidates c WHERE c.key_ref = d.key_ref)"
            " AND NOT EXISTS (SELECT 1 FROM records r WHERE r.key_ref = d.key_ref) RETURNING key_ref",
            [ORPHAN_KEY_GRACE],
        )
        if rows:
            self._store.keys_destroyed.set()
        return len(rows)


class PostgresReplay:
    """The signed-context replay cache, shared by every node: a context accepted by one node is
    refused by all the others for as long as any node could still accept it.

    Every decision is the database's clock's, never this node's (whose clock may run fast or slow):
    a context past ``exp + CLOCK_LEEWAY_S`` by the database's clock is refused (``verify`` on a slow
    node would still take it), and a claim is held until ``exp + CLOCK_LEEWAY_S + REPLAY_SKEW_S``, so
    a node whose clock is behind the database's by up to REPLAY_SKEW_S, still accepting the token,
    finds it claimed. (Re-claiming at ``exp < now`` let a context be replayed in the 5 s after it
    expired, and longer on a node whose clock ran fast.)"""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        self._claims = 0
        self._lock = threading.Lock()

    def claim(self, kid: str, jti: str, exp: int, now: float) -> bool:
        # ``now`` (this node's clock) decided ``verify``; the shared decision below ignores it.
        with self._lock:
            self._claims += 1
            sweep = self._claims % 1024 == 0
        if sweep:
            self._store.one("DELETE FROM replay WHERE exp + %s < extract(epoch FROM now()) RETURNING 1",
                            [REPLAY_HOLD_S])
        row = self._store.one(
            "INSERT INTO replay SELECT %s, %s, %s WHERE %s + %s >= extract(epoch FROM now())"
            " ON CONFLICT (kid, jti) DO UPDATE SET exp = excluded.exp"
            " WHERE replay.exp + %s < extract(epoch FROM now()) RETURNING 1",
            [kid, jti, exp, exp, CLOCK_LEEWAY_S, REPLAY_HOLD_S],
        )
        return row is not None


def _approval_tuple(row: tuple[Any, ...]) -> tuple[Any, ...]:
    # BYTEA comes back as memoryview: the sealed arguments as bytes, like DuckDB's BLOB.
    return tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
