"""Several nodes of one PostgreSQL store under faults (issue 38): each finding of the review is a
test that failed before its fix. Nodes here are real engines, each with its own data dir and its
own connection pool, heartbeat and watcher, on one real PostgreSQL database (``.ci/pg``); faults
are injected at the named points (a failed key deletion, a failed acknowledgement, a reader
holding ``data_keys``, a peer's admission landing mid-backfill, a fast node clock)."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engram_memory.models.hostauth import CLOCK_LEEWAY_S
from engram_memory.models.settings import EngineSettings
from engram_memory.store.core.engine import Engine
from engram_memory.store.core.timeutil import to_instant
from engram_memory.store.postgres.backend import (
    HEARTBEAT_S,
    POLL_S,
    REPLAY_HOLD_S,
    VACUUM_RETRY_S,
    PostgresStore,
    init_store,
)
from tests.conftest import fresh_database, search_args
from tests.store_fixtures import admission_args, call, capture_args, ctx, forget_args, withdraw_args

SCOPE = ctx().scope_ref


class Store:
    """One initialised PostgreSQL store and the nodes opened on it (closed at the end)."""

    def __init__(self, url: str, root: Path, stack: ExitStack) -> None:
        self.url, self.root, self.stack = url, root, stack
        self.key_file = root / "master.key"
        self.key_file.write_bytes(secrets.token_bytes(32))
        init_store(url, self.key_file.read_bytes())
        self.serial = 0

    def settings(self, name: str, semantic: bool = False) -> EngineSettings:
        return EngineSettings(data_dir=self.root / name, store=self.url, master_key_file=self.key_file,
                              semantic=semantic)

    def node(self, name: str, semantic: bool = False, *, before_recover: Callable[[Engine], None] | None = None
             ) -> Engine:
        """A serving node: Engine.open, or its two steps with ``before_recover`` (a fault planted
        before the node's background work starts)."""
        if before_recover is None:
            engine = Engine.open(self.settings(name, semantic))
        else:
            settings = self.settings(name, semantic)
            db = PostgresStore(self.url, self.key_file.read_bytes(), settings.data_dir, key_file=self.key_file)
            engine = Engine(settings, db)
            before_recover(engine)
            engine.recover()
        self.stack.callback(engine.close)
        return engine

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(sql.encode(), params).fetchall()

    def admit(self, engine: Engine, text: str) -> str:
        self.serial += 1
        cap = call(engine, "capture", ctx(), capture_args(text, key=f"capture-key-{self.serial:06d}"))
        out = call(engine, "request_admission", ctx(),
                   admission_args(cap["candidate_id"], key=f"admit-key-{self.serial:08d}"))
        assert out["outcome"]["status"] == "accepted", out
        return str(out["outcome"]["record_id"])


@pytest.fixture
def store(pg_url: str, tmp_path: Path) -> Iterator[Store]:
    with fresh_database(pg_url, "faults") as url, ExitStack() as stack:
        yield Store(url, tmp_path, stack)


def search(engine: Engine, query: str) -> list[str]:
    out = call(engine, "search", ctx(), search_args(query, limit=20))
    return [r["record"]["record_id"] for r in out["records"]]


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not reached within {timeout} s: {what}"
        time.sleep(0.1)


def db_now(store: Store) -> int:
    return int(store.rows("SELECT extract(epoch FROM now())::bigint")[0][0])


# ---- 1. a signed context is claimed for as long as any node could accept it ------------------------


def test_a_context_stays_claimed_past_its_expiry_by_the_database_clock(store: Store) -> None:
    """The claim re-opened once the stored exp was below ``now``: the same context was accepted
    again at exp+1, exp+2, exp+4.9 (verify's leeway), and at once on a node whose clock ran fast."""
    a = PostgresStore(store.url, store.key_file.read_bytes(), store.root / "a", key_file=store.key_file)
    b = PostgresStore(store.url, store.key_file.read_bytes(), store.root / "b", key_file=store.key_file)
    store.stack.callback(a.close)
    store.stack.callback(b.close)
    on_a, on_b = a.replay_guard(), b.replay_guard()
    now = db_now(store)
    exp = now - 1  # expired a second ago: verify (leeway 5 s) still accepts it
    assert on_a.claim("host-a", "jti-1", exp, now)
    for late in (exp + 1, exp + 2, exp + 4.9):
        assert not on_b.claim("host-a", "jti-1", exp, late)
        assert not on_a.claim("host-a", "jti-1", exp, late)
    # A node whose clock runs an hour fast decides nothing: the database's clock does.
    assert not on_b.claim("host-a", "jti-1", exp, now + 3600)
    # A node whose clock runs slow would accept a context long expired: the database refuses it.
    assert not on_b.claim("host-a", "jti-2", now - CLOCK_LEEWAY_S - 2, now - 600)
    # A fresh context is claimed once, whatever the node's clock says.
    assert on_b.claim("host-a", "jti-3", now + 60, now - 600)
    assert not on_a.claim("host-a", "jti-3", now + 60, now + 600)
    # The row is kept until exp + leeway + the skew margin, by the database's clock, and only then
    # may the id be claimed again (no node accepts it by then).
    store.rows("UPDATE replay SET exp = %s WHERE jti = 'jti-1' RETURNING 1", (now - REPLAY_HOLD_S + 1,))
    assert not on_a.claim("host-a", "jti-1", now - REPLAY_HOLD_S + 1, now + 3600)
    assert store.rows("SELECT count(*) FROM replay WHERE jti = 'jti-1'") == [(1,)]


# ---- 2. "complete" means the data key's row is gone, whichever node left it ----------------------


@pytest.mark.parametrize("tool", ["forget", "withdraw"])
def test_a_pending_answer_completes_only_once_its_key_row_is_gone(store: Store, tool: str) -> None:
    """A commits the forget (or withdraw), then its key deletion fails and A dies: A answered
    "pending". B completed every pending answer of the scope as soon as its own retry list was
    empty, so a retry on B answered "complete" with the key's data_keys row still there."""
    a, b = store.node("a"), store.node("b")
    if tool == "forget":
        target = store.admit(a, "The marsh harrier quarters the reed bed at dawn.")
        key_ref = store.rows("SELECT key_ref FROM records WHERE record_id = %s", (target,))[0][0]
        args = forget_args(target, key="forget-owed-000001")
        state = "projection_invalidation"
    else:
        cap = call(a, "capture", ctx(), capture_args("The marsh harrier nests low.", key="capture-owed-0001"))
        target = cap["candidate_id"]
        key_ref = store.rows("SELECT key_ref FROM candidates WHERE candidate_id = %s", (target,))[0][0]
        args = withdraw_args(target, key="withdraw-owed-0001")
        state = "key_destruction"
    assert search(b, "harrier") == ([target] if tool == "forget" else [])
    a.keys.destroy = lambda ref: False  # type: ignore[method-assign]  # the DELETE fails on A
    first = call(a, tool, ctx(), args)
    assert first[state] == "pending"
    a.lifecycle.pending_keys.clear()  # A dies with its retry list
    a.close()

    def key_row() -> bool:
        return bool(store.rows("SELECT 1 FROM data_keys WHERE key_ref = %s", (key_ref,)))

    assert key_row()
    answers = [call(b, tool, ctx(), args)]
    search(b, "harrier")  # B's next use of the scope completes what it can
    answers.append(call(b, tool, ctx(), args))
    for answer in answers:
        assert answer["receipt"] == first["receipt"] and answer["replayed"] is True
    # B destroyed the key A left, and only then answered "complete".
    assert answers[-1][state] == "complete"
    assert not key_row()
    assert store.rows("SELECT value FROM idempotency WHERE key_ref = %s", (key_ref,))[0][0].count('"complete"') == 1


# ---- 3. a failed acknowledgement is made again ------------------------------------------------------


def test_a_failed_acknowledgement_does_not_leave_a_forget_pending_for_good(store: Store) -> None:
    """B purges A's forget, then its acknowledgement fails once (a dropped connection). _sync
    returned early whenever B's projections were level, so B never acknowledged again and A's
    answer stayed "pending" however long one waited."""
    a, b = store.node("a"), store.node("b")
    target = store.admit(a, "The spoonbill feeds in the tidal lagoon.")
    assert search(b, "spoonbill") == [target]
    real = b.db.acknowledge
    failures: list[int] = []

    def flaky(scope_ref: str, cursor: int) -> None:
        if not failures:
            failures.append(cursor)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        real(scope_ref, cursor)

    b.db.acknowledge = flaky  # type: ignore[method-assign]
    args = forget_args(target, key="forget-ack-0000001")
    first = call(a, "forget", ctx(), args)
    assert failures, "B's acknowledgement was never attempted"
    assert first["projection_invalidation"] == "pending"
    assert search(b, "spoonbill") == []  # B purged it: only its acknowledgement failed

    def completed() -> bool:
        return bool(call(a, "forget", ctx(), args)["projection_invalidation"] == "complete")

    wait_for(completed, 3 * POLL_S, "the forget completes once B acknowledged again")
    assert store.rows("SELECT min(cursor) FROM node_cursors WHERE scope_ref = %s", (SCOPE,)) \
        == store.rows("SELECT projection_cursor FROM scopes WHERE scope_ref = %s", (SCOPE,))


# ---- 6. a node in its first sync of a scope is waited for ------------------------------------------


def test_a_forget_waits_for_a_node_in_the_middle_of_its_first_sync(store: Store) -> None:
    """B catches up on a scope for the first time: it has no node_cursors row until it finishes,
    so a forget A commits meanwhile counted nobody behind and answered "complete" at once, while
    B went on to index the record it forgot."""
    a = store.node("a")
    target = store.admit(a, "The bearded tit pings from the reeds.")
    b = store.node("b")
    real = b._project
    answers: list[dict[str, Any]] = []

    def forget_meanwhile(scope_ref: str, gone: list[str], back: list[str], cursor: int) -> list[dict[str, Any]]:
        if not answers:  # B has read the journal's cursor and is about to apply what came before it
            answers.append(call(a, "forget", ctx(), forget_args(target, key="forget-first-00001")))
        return real(scope_ref, gone, back, cursor)

    b._project = forget_meanwhile  # type: ignore[method-assign]
    search(b, "bearded tit")
    assert answers and answers[0]["projection_invalidation"] == "pending"
    assert search(b, "bearded tit") == []  # B's next read applies the forget
    wait_for(lambda: call(a, "forget", ctx(), forget_args(target, key="forget-first-00001"))
             ["projection_invalidation"] == "complete", 3 * POLL_S, "the forget completes once B is level")


# ---- 4. a backup's long read of data_keys stalls neither heartbeats nor key loads ------------------


def test_a_repeatable_read_reader_of_data_keys_stalls_no_heartbeat_and_no_key_load(store: Store) -> None:
    """VACUUM FULL data_keys ran on the heartbeat thread with no lock timeout: behind a pg_dump-like
    REPEATABLE READ transaction it blocked there (the node stopped heartbeating and was declared
    dead) and every key load queued behind its exclusive lock."""
    a = store.node("a")
    kept = store.admit(a, "The water rail squeals from the ditch.")
    target = store.admit(a, "The cetti's warbler bursts into song.")
    kept_key = store.rows("SELECT key_ref FROM records WHERE record_id = %s", (kept,))[0][0]
    filenode = store.rows("SELECT pg_relation_filenode('data_keys')")[0][0]
    reader = psycopg.connect(store.url)
    try:
        reader.execute(b"BEGIN ISOLATION LEVEL REPEATABLE READ")
        reader.execute(b"SELECT count(*) FROM data_keys").fetchone()  # holds its lock to the end
        call(a, "forget", ctx(), forget_args(target, key="forget-vacuum-0001"))  # a key destroyed
        time.sleep(2 * HEARTBEAT_S + 1)  # the vacuum has tried (and given up) by now
        loads: list[float] = []

        def load() -> None:
            started = time.monotonic()
            assert a.keys.load(kept_key) is not None
            loads.append(time.monotonic() - started)

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        loader.join(5)
        assert loads and loads[0] < 1.0, f"a key load waited {loads or 'more than 5 s'}"
        age = store.rows("SELECT extract(epoch FROM now() - heartbeat_at) FROM nodes WHERE node_id = %s",
                         (a.db.node_id,))[0][0]  # type: ignore[attr-defined]
        assert float(age) < 2 * HEARTBEAT_S + 1, f"the heartbeat is {age} s old"
    finally:
        reader.close()
    # The reader gone, the vacuum runs on its next try: the table's file is rewritten.
    wait_for(lambda: store.rows("SELECT pg_relation_filenode('data_keys')")[0][0] != filenode,
             3 * VACUUM_RETRY_S, "data_keys is vacuumed once the reader ends")


# ---- 5. a peer's admission synced during the backfill gets its vector indexed ----------------------


def test_a_peer_admission_synced_during_the_backfill_is_in_the_vector_index(store: Store) -> None:
    """Between B's vector repair and its semantic channel's readiness, a sync indexed A's
    admission in Tantivy only; A had stored its vector, so B's backfill (which embeds what has no
    stored vector) never added it: B's hybrid answers lacked it until a restart."""
    a = store.node("a", semantic=True)
    assert a.wait_semantic(300)
    first = store.admit(a, "The osprey platform by the reservoir has a new pair.")
    synced: list[str] = []

    def plant(b: Engine) -> None:
        real = b._missing_embeddings

        def peer_admits_meanwhile(limit: int) -> Any:
            if not synced:  # B's loader, under B's lock, past its vector repair
                synced.append(store.admit(a, "A hobby hunts dragonflies over the heath."))
                b._sync(SCOPE)  # what B's watcher or a read does meanwhile
            return real(limit)

        b._missing_embeddings = peer_admits_meanwhile  # type: ignore[method-assign]

    b = store.node("b", semantic=True, before_recover=plant)
    assert b.wait_semantic(300) and synced
    index = b.projections.vectors(SCOPE)
    assert [rid for rid in (first, synced[0]) if not index.contains(rid)] == []
    assert store.rows("SELECT count(*) FROM embeddings")[0][0] == 2  # indexed from A's vectors, not embedded again


# ---- 7. an embedding is never stored for a record forgotten meanwhile -----------------------------


def test_a_forget_committed_during_an_embedding_write_leaves_no_embedding(store: Store) -> None:
    """_embed_and_store read the records' keys and inserted their embeddings in a transaction that
    did not take the scope's lock: a forget committed in between, and the insert left an
    embeddings row for the tombstoned record. The same transaction, driven step by step here."""
    a = store.node("a")
    target = store.admit(a, "The short-eared owl hunts the rough grassland.")
    forgot: list[dict[str, Any]] = []
    forgetting = threading.Thread(
        target=lambda: forgot.append(call(a, "forget", ctx(), forget_args(target, key="forget-embed-00001"))),
        daemon=True)
    with a.db.transaction() as uow:
        assert [rid for rid, _ in uow.live_keys(SCOPE, [target], "accepted_current")] == [target]
        forgetting.start()
        forgetting.join(1.5)  # the forget commits now unless this transaction holds the scope's lock
        uow.insert_embeddings([(target, "sha256:" + "0" * 64, SCOPE, b"sealed-vector")])
    forgetting.join(30)
    assert forgot and forgot[0]["receipt"]["to_state"] == "tombstoned"
    assert store.rows("SELECT count(*) FROM embeddings WHERE record_id = %s", (target,)) == [(0,)]


# ---- 8. the database's clock decides what must agree across nodes ---------------------------------


def test_a_node_whose_clock_runs_fast_expires_nothing_early(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Expiry used each node's wall clock while heartbeats used the database's: one node running
    an hour fast expired a record due in ten minutes, for every node (the expire event is shared)."""
    a = store.node("a")
    due = db_now(store) * 1000 + 600_000
    cap = call(a, "capture", ctx(), capture_args("The wheatear passes through in April.", key="capture-clock-0001",
                                                 retention={"derivative_rule": "make-ineligible",
                                                            "expires_at": to_instant(due)}))
    out = call(a, "request_admission", ctx(), admission_args(cap["candidate_id"], key="admit-clock-00001"))
    target = out["outcome"]["record_id"]
    a.close()
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + 3_600 * 10**9)  # this process's clock: an hour fast
    fast = store.node("fast")
    assert search(fast, "wheatear") == [target]
    assert store.rows("SELECT count(*) FROM journal WHERE operation = 'expire'") == [(0,)]
    assert abs(fast.clock() - db_now(store) * 1000) < 5_000  # the database's clock, not the node's
    # What is due by the database's clock does expire.
    store.rows("UPDATE records SET expires_at_ms = %s WHERE record_id = %s RETURNING 1",
               (db_now(store) * 1000 - 1_000, target))
    fast._views.clear()
    assert search(fast, "wheatear") == []
    assert store.rows("SELECT count(*) FROM journal WHERE operation = 'expire'") == [(1,)]
