"""``engram-memory crash``: SIGKILL the real server under concurrent mutations, recover, check.

Each trial starts ``serve --http`` (lexical only, no rate limit: it starts without the model)
on a fresh data dir and runs ``--clients`` concurrent signing SDK clients (two tenants, one
principal each) doing a seeded mix of capture, request_admission, withdraw and forget (each
with a signed confirmation where the gate asks for one), plus replays of finished operations
with their same key and arguments. At a random moment the server gets SIGKILL. The harness
then reads, read-only, which idempotency keys the dead server had committed (the ledger row is
written in the operation's own transaction), restarts the server on the same dir, and every
client re-sends each operation that had no definitive answer (no answer, a transport error,
``MUTATION_OUTCOME_UNKNOWN``, ``STORE_UNAVAILABLE``) with the same key and arguments until it
is definitive, replays some finished ones, reads back its records, and the server is stopped.
Checked per trial:

* every operation ends with a definitive answer (none left hanging);
* answers agree: every definitive answer of one operation names the same candidate, record,
  cursor and receipts, and at most one of them is a first application (the rest say
  ``duplicate_exact`` / ``replayed``);
* the outcome-unknown truth: an operation answered before the kill was committed before it;
  an unanswered one whose retry says "already applied" had committed before the kill, one whose
  retry applies it had not (against the ledger read from the killed server's files);
* exactly once in the store: one candidate per capture, the candidate and record states the
  answers imply, one journal event and one ledger row per committed operation, nothing else;
* reads agree: each record is readable with ``get`` unless it was forgotten;
* ``verify_store`` is ok: journal chains and heads, digests, no orphan keys or rows, and
  projections equal to a fresh rebuild.

    engram-memory crash --trials 100 --seed 1 --clients 4 --out out/crash

On PostgreSQL (issue 22), ``--store URL`` names a server and a role that may CREATE DATABASE
(a libpq URL without a password). The checks are store-wide ("nothing else in the store"), so,
like the DuckDB trials' fresh data dirs, each trial gets a fresh database, initialised with the
real ``engram-memory admin init-store`` (its master key file lands in the trial's dir), dropped
when the trial passes and kept, with its URL in ``store.url``, when it fails; pointing the
harness at a store in use would neither isolate it nor leave that store clean. ``--nodes N``
starts N servers on the one database (each its own data dir), spreads the clients over them
and SIGKILLs one at random; the ledger is read once PostgreSQL has ended every session of the
killed node (a COMMIT already in its socket still commits). Its clients' retries go to the other
nodes while it is down; then it restarts, and every node is read back in every tenant (each
admitted record readable unless forgotten, a search matching every record finding exactly the
current ones), before the same answer and exactly-once checks and ``checks/pg_verify.py``
(journal chains and heads, lifecycle rows, keys, every node's projections against a rebuild).

    engram-memory crash --trials 40 --seed 1 --clients 4 --nodes 2 --store postgresql://USER@HOST:PORT/DB \
        --out out/crash-pg
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import json  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated, Any  # noqa: E402

import typer  # noqa: E402

from engram_memory.eval.bench_http import (  # noqa: E402
    KID,
    PURPOSE,
    WORKSPACE,
    StoreArgs,
    Target,
    Texts,
    capture_arguments,
    check_admin_url,
    connect,
    init_store,
    make_keys,
    read_audience,
    start_node,
)
from engram_memory.eval.bench_http import UsageError as BenchUsageError  # noqa: E402

Opt = typer.Option

TENANTS = ("crash-t0", "crash-t1")
INDEFINITE = frozenset({"MUTATION_OUTCOME_UNKNOWN", "STORE_UNAVAILABLE", "RATE_LIMITED"})
CONFIRMED = frozenset({"withdraw", "forget"})
MIX = (("capture", 0.35), ("request_admission", 0.30), ("withdraw", 0.08), ("forget", 0.12), ("replay", 0.15))
CALL_TIMEOUT_S = 30.0
RETRY_ATTEMPTS = 40
REPLAYS_AFTER = 4  # per client, after recovery
FAULTS = ("stop", "reader")  # --faults: SIGSTOP a node that is not killed; a long REPEATABLE READ reader
# Once every node is up again, pending answers are completed and owed keys destroyed within this:
# a node's watcher re-checks each scope every 5 s (POLL_S) and a frozen node is live for 10 s.
DRAIN_BOUND_S = 30.0
EVENT_OPERATIONS = {"capture": ("capture",), "request_admission": ("accept", "reject"), "withdraw": ("withdraw",),
                    "forget": ("tombstone",)}


class UsageError(ValueError):
    """A mistake in the command line: one line, exit 2."""


# ---- operations and answers ---------------------------------------------------------------------


@dataclass
class Attempt:
    phase: str  # load | recovery
    outcome: str  # ok | error | indefinite
    code: str | None = None  # error code, or the exception's type for a transport failure
    value: dict[str, Any] | None = None


@dataclass
class Op:
    """One logical operation: one idempotency key, one set of arguments, any number of sends."""

    op_id: str
    client: int
    tenant: str
    principal: str
    tool: str
    args: dict[str, Any]
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def key(self) -> str:
        return str(self.args["idempotency_key"])

    def definitive(self) -> list[Attempt]:
        return [a for a in self.attempts if a.outcome != "indefinite"]

    def final(self) -> Attempt | None:
        done = self.definitive()
        return done[-1] if done else None

    def answered_in_load(self) -> bool:
        return any(a.phase == "load" and a.outcome != "indefinite" for a in self.attempts)


def fresh(tool: str, value: dict[str, Any]) -> bool:
    """Whether an ok answer is the first application (not a replay of an earlier commit)."""
    if tool == "capture":
        return value.get("status") == "committed_pending"
    return value.get("replayed") is False and (tool != "request_admission"
                                               or value["outcome"].get("status") != "duplicate_exact")


def identity(tool: str, value: dict[str, Any]) -> Any:
    """What every answer of one operation must repeat exactly."""
    if tool == "capture":
        return {k: value.get(k) for k in ("candidate_id", "record_digest", "cursor", "transaction_receipt_digest")}
    if tool == "request_admission":
        return value["outcome"]
    return value["receipt"]


def committed(op: Op) -> bool:
    """The operation's final answer says a transaction committed (a ledger row and an event exist)."""
    final = op.final()
    if final is None or final.outcome != "ok" or final.value is None:
        return False
    if op.tool == "request_admission":
        return final.value["outcome"]["status"] in ("accepted", "rejected")
    return True


# ---- the clients --------------------------------------------------------------------------------


@dataclass
class Shared:
    """What the conductor and the clients share within one trial."""

    killed: bool = False
    calls: int = 0
    in_flight: Counter[str] = field(default_factory=Counter)  # tool -> calls sent, not yet answered
    read_failures: list[str] = field(default_factory=list)


async def send(host: Any, op: Op, phase: str, shared: Shared) -> Attempt:
    import anyio

    shared.in_flight[op.tool] += 1
    try:
        with anyio.fail_after(CALL_TIMEOUT_S):
            env = await host.call(op.tool, op.args, op.tool in CONFIRMED)
    except Exception as exc:  # noqa: BLE001 - a dead server: no answer, the outcome is unknown
        attempt = Attempt(phase, "indefinite", type(exc).__name__)
    except BaseException as exc:  # the SDK session cancels its calls when its connection dies
        shared.calls += 1
        op.attempts.append(Attempt(phase, "indefinite", type(exc).__name__))
        raise
    else:
        if env.get("ok"):
            attempt = Attempt(phase, "ok", value=(env.get("output") or {}).get("value"))
        else:
            code = str((env.get("error") or {}).get("code"))
            attempt = Attempt(phase, "indefinite" if code in INDEFINITE else "error", code)
    finally:
        shared.in_flight[op.tool] -= 1
    shared.calls += 1
    op.attempts.append(attempt)
    return attempt


async def load_client(target: Target, index: int, rng: random.Random, texts: Texts, prefix: str,
                      ops: list[Op], shared: Shared, ready: Any, go: Any) -> None:
    """The seeded mix until the server is gone (its first unanswered call ends the client)."""
    tenant = TENANTS[index % len(TENANTS)]
    principal = f"{prefix}-c{index}"
    pending: list[str] = []  # candidate ids with a definitive capture
    records: list[str] = []
    done: list[Op] = []  # ops with an ok answer, for replays
    serial = 0
    tools, weights = [t for t, _ in MIX], [w for _, w in MIX]
    try:
        async with connect(target, tenant, principal) as host:
            ready()
            await go.wait()
            while not shared.killed:
                tool = rng.choices(tools, weights)[0]
                if tool in ("request_admission", "withdraw") and not pending:
                    tool = "capture"
                if tool == "forget" and not records:
                    tool = "capture"
                if tool == "replay" and not done:
                    tool = "capture"
                if tool == "replay":
                    op = rng.choice(done)
                else:
                    serial += 1
                    key = f"{principal}-{tool[:3]}-{serial:06d}"
                    if tool == "capture":
                        args = capture_arguments(texts.text(f"{principal} {serial}", rng), key)
                    elif tool == "request_admission":
                        args = {"candidate_id": pending.pop(0), "idempotency_key": key}
                    elif tool == "withdraw":
                        args = {"candidate_id": pending.pop(rng.randrange(len(pending))), "idempotency_key": key,
                                "reason_ref": "reason:crash-withdraw"}
                    else:
                        args = {"record_id": records.pop(rng.randrange(len(records))), "idempotency_key": key,
                                "reason_ref": "reason:crash-forget"}
                    op = Op(f"{principal}:{serial}", index, tenant, principal, tool, args)
                    ops.append(op)
                attempt = await send(host, op, "load", shared)
                if attempt.outcome == "indefinite":
                    break  # the server is gone (or unsure): recovery retries it with the same key
                if attempt.outcome == "ok" and tool != "replay":
                    assert attempt.value is not None
                    done.append(op)
                    if op.tool == "capture":
                        pending.append(attempt.value["candidate_id"])
                    elif op.tool == "request_admission" and attempt.value["outcome"].get("record_id"):
                        records.append(attempt.value["outcome"]["record_id"])
    except Exception:  # noqa: BLE001 - the session's teardown against a killed server
        ready()  # (never blocks the conductor)


async def recovery_client(target: Target, index: int, rng: random.Random, prefix: str, ops: list[Op],
                          shared: Shared) -> None:
    """Retry every unanswered operation until definitive, replay a few answered ones, read back."""
    import anyio

    tenant = TENANTS[index % len(TENANTS)]
    mine = [op for op in ops if op.client == index]
    async with connect(target, tenant, f"{prefix}-c{index}") as host:
        for op in mine:
            for attempt_no in range(RETRY_ATTEMPTS):
                if op.final() is not None:
                    break
                attempt = await send(host, op, "recovery", shared)
                if attempt.outcome == "indefinite":
                    await anyio.sleep(min(0.05 * (attempt_no + 1), 1.0))
        answered = [op for op in mine if committed(op)]
        for op in rng.sample(answered, min(REPLAYS_AFTER, len(answered))):
            await send(host, op, "recovery", shared)
        # Read back: every record admitted by this client is readable unless it was forgotten.
        forgotten = {op.args["record_id"] for op in mine if op.tool == "forget" and committed(op)}
        for op in mine:
            final = op.final()
            if op.tool != "request_admission" or final is None or final.value is None:
                continue
            rid = final.value["outcome"].get("record_id")
            if rid is None:
                continue
            with anyio.fail_after(CALL_TIMEOUT_S):
                env = await host.call("get", {"record_id": rid, "purpose_ref": PURPOSE})
            got = "ok" if env.get("ok") else str((env.get("error") or {}).get("code"))
            expected = "NOT_FOUND" if rid in forgotten else "ok"
            if got != expected:
                shared.read_failures.append(f"get {rid} answered {got}, expected {expected}")
        # A search makes the server bring a lagging projection up to date before it stops.
        with anyio.fail_after(CALL_TIMEOUT_S):
            await host.call("search", {"query": "note", "purpose_ref": PURPOSE, "limit": 5})


# ---- the server ---------------------------------------------------------------------------------


def start_server(data_dir: Path, keys_dir: Path, log: Path, store: StoreArgs | None = None,
                 env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    proc, base = start_node(data_dir, keys_dir, log, store or StoreArgs(), env=env)
    return proc, base + "/mcp"


def stop_server(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return -9


def ledger_keys(store: Path | str) -> set[tuple[str, str, str]]:
    """(scope, principal, key digest) of every committed operation: read-only from a stopped DuckDB
    store (a data dir), or from a PostgreSQL store (a URL) once the killed node's sessions are gone."""
    if isinstance(store, str):
        import psycopg

        with psycopg.connect(store, autocommit=True) as conn:
            rows = conn.execute("SELECT scope_ref, principal, key_digest FROM idempotency").fetchall()
        return {(str(a), str(b), str(c)) for a, b, c in rows}
    import duckdb

    con = duckdb.connect(str(store / "engram.duckdb"), read_only=True)
    try:
        return {(str(a), str(b), str(c)) for a, b, c in
                con.execute("SELECT scope_ref, principal, key_digest FROM idempotency").fetchall()}
    finally:
        con.close()


def wait_disconnected(url: str, application_name: str, timeout: float = 60.0) -> bool:
    """Wait until PostgreSQL has ended every session of a killed node (named by PGAPPNAME).

    A COMMIT the node sent just before SIGKILL may still sit in its socket: the backend executes it
    after the process is gone. Only once every backend of the node has exited is the ledger the
    truth about what the killed node committed."""
    import psycopg

    from engram_memory.store.postgres.databases import sessions_of

    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            if sessions_of(conn, application_name) == 0:
                return True
            time.sleep(0.05)
    return False


def ledger_id(op: Op) -> tuple[str, str, str]:
    from engram_memory.store.core.ledger import key_digest

    return f"tenant:{op.tenant}/workspace:{WORKSPACE}", op.principal, key_digest(op.key)


# ---- the checks ---------------------------------------------------------------------------------


def check_answers(ops: list[Op], before_kill: set[tuple[str, str, str]]) -> list[str]:
    """Definitive, consistent answers; unknown outcomes resolved to the truth."""
    failures: list[str] = []
    for op in ops:
        final = op.final()
        if final is None:
            failures.append(f"{op.op_id} {op.tool}: no definitive answer after {len(op.attempts)} attempts")
            continue
        oks = [a for a in op.definitive() if a.outcome == "ok"]
        errors = [a for a in op.definitive() if a.outcome == "error"]
        if errors:
            failures.append(f"{op.op_id} {op.tool}: unexpected answer {errors[0].code}")
            continue
        if len({json.dumps(identity(op.tool, a.value or {}), sort_keys=True) for a in oks}) > 1:
            failures.append(f"{op.op_id} {op.tool}: answers to the same key disagree")
        if not committed(op):
            continue
        firsts = [a for a in oks if fresh(op.tool, a.value or {})]
        applied_before = ledger_id(op) in before_kill
        if len(firsts) > 1:
            failures.append(f"{op.op_id} {op.tool}: applied {len(firsts)} times (more than one first answer)")
        if op.answered_in_load() and not applied_before:
            failures.append(f"{op.op_id} {op.tool}: answered before the kill but not committed then (lost)")
        if not firsts and not applied_before:
            failures.append(f"{op.op_id} {op.tool}: every answer is a replay, yet nothing had committed before")
        recovered_first = [a for a in firsts if a.phase == "recovery"]
        if recovered_first and applied_before:
            failures.append(f"{op.op_id} {op.tool}: the retry applied it again though it had committed before "
                            "the kill (the unknown outcome resolved to a lie)")
    return failures


STORE_QUERIES = ("SELECT candidate_id, state FROM candidates", "SELECT record_id, state FROM records",
                 "SELECT operation FROM journal", "SELECT count(*) FROM idempotency")


def _store_rows(store: Path | str) -> list[list[tuple[Any, ...]]]:
    if isinstance(store, str):
        import psycopg

        with psycopg.connect(store, autocommit=True) as conn:
            return [conn.execute(q).fetchall() for q in STORE_QUERIES]
    import duckdb

    con = duckdb.connect(str(store / "engram.duckdb"), read_only=True)
    try:
        return [con.execute(q).fetchall() for q in STORE_QUERIES]
    finally:
        con.close()


def check_store(store: Path | str, ops: list[Op]) -> list[str]:
    """Exactly once: the stopped store (a DuckDB data dir, or a PostgreSQL URL) holds what the
    answers imply and nothing else."""
    failures: list[str] = []
    cand_rows, rec_rows, event_rows, ledger = _store_rows(store)
    candidates = {str(c): str(st) for c, st in cand_rows}
    records = {str(r): str(st) for r, st in rec_rows}
    events = Counter(str(op) for (op,) in event_rows)
    ledger_rows = ledger[0] if ledger else None
    done = [op for op in ops if committed(op)]
    captured = {op.final().value["candidate_id"] for op in done if op.tool == "capture"}  # type: ignore[union-attr,index]
    if set(candidates) != captured:
        failures.append(f"candidates in the store ({len(candidates)}) are not the captures answered "
                        f"({len(captured)}): {len(set(candidates) - captured)} extra, "
                        f"{len(captured - set(candidates))} missing")
    expected: dict[str, str] = dict.fromkeys(captured, "pending")
    expected_records: dict[str, str] = {}
    for op in done:
        value = op.final().value  # type: ignore[union-attr]
        assert value is not None
        if op.tool == "request_admission":
            expected[op.args["candidate_id"]] = value["outcome"]["status"]
            if value["outcome"].get("record_id"):
                expected_records[value["outcome"]["record_id"]] = "accepted_current"
        elif op.tool == "withdraw":
            expected[op.args["candidate_id"]] = "withdrawn"
    for op in done:
        if op.tool == "forget":
            expected_records[op.args["record_id"]] = "tombstoned"
    wrong = [cid for cid, state in expected.items() if candidates.get(cid, state) != state]
    if wrong:
        failures.append(f"{len(wrong)} candidates are not in the state their answers imply")
    if records != expected_records:
        failures.append(f"records in the store ({len(records)}) differ from those the answers imply "
                        f"({len(expected_records)})")
    want: Counter[str] = Counter()
    for op in done:
        value = op.final().value  # type: ignore[union-attr]
        assert value is not None
        if op.tool == "request_admission":
            want["accept" if value["outcome"]["status"] == "accepted" else "reject"] += 1
        else:
            want[EVENT_OPERATIONS[op.tool][0]] += 1
    if +events != +want:
        failures.append(f"journal events {dict(events)} are not one per committed operation {dict(want)}")
    if ledger_rows is None or int(ledger_rows[0]) != len(done):
        failures.append(f"ledger rows {ledger_rows[0] if ledger_rows else 0} != committed operations {len(done)}")
    return failures


# ---- one trial ----------------------------------------------------------------------------------


@dataclass
class TrialResult:
    trial: int
    ok: bool
    seconds: float
    kill_after_s: float
    operations: int
    calls: int
    retries: int  # recovery sends of operations unanswered before the kill
    replays: int  # sends of an operation after its first definitive answer
    in_flight_at_kill: dict[str, int]
    mid_write: bool  # a mutation was in flight when the server died
    unknown_applied: int  # unanswered at the kill, yet committed before it
    unknown_not_applied: int  # unanswered at the kill, applied by the retry
    by_tool: dict[str, int]
    failures: list[str]
    indefinite_codes: dict[str, int] = field(default_factory=dict)  # what "no definitive answer" looked like
    # withdraw/forget whose final answer still says key destruction / projection invalidation "pending"
    # (committed, then killed before the ledger's upgrade: replays repeat "pending" though recovery finished it)
    pending_after_recovery: int = 0
    stop_exit: int | None = None  # the recovered server's exit status after SIGTERM (0: it closed its engine)
    verify: dict[str, Any] | None = None
    killed_node: int = 0  # which node got SIGKILL (of ``nodes``, all on one store)
    nodes: int = 1
    faults: list[str] = field(default_factory=list)  # --faults: what else the trial did to the nodes
    stopped_node: int | None = None  # which node got SIGSTOP (fault "stop"), and for how long
    stopped_s: float = 0.0
    drained_s: float | None = None  # every node healthy: until no answer was "pending" nor key owed

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_trial(trial: int, seed: int, clients: int, keys_dir: Path, work: Path, max_kill_s: float,
              keep: bool = False, store: str | None = None, nodes: int = 1,
              faults: tuple[str, ...] = ()) -> tuple[TrialResult, list[Op], set[tuple[str, str, str]]]:
    """One kill-and-recover trial. ``store`` None: DuckDB in the trial's data dir, one server.
    ``store`` a PostgreSQL admin URL: a fresh database initialised with ``admin init-store``,
    ``nodes`` servers on it (clients spread over them), one of them killed; with several nodes
    the retries go to the others while it is down, then it restarts and every node is read back."""
    import anyio

    from engram_memory.store.maintenance.verify import verify_store

    rng = random.Random(f"{seed}:{trial}")
    data_dir = work / f"trial-{trial:04d}"
    shutil.rmtree(data_dir, ignore_errors=True)
    log = work / f"trial-{trial:04d}.stderr"
    prefix = f"s{seed}t{trial}"
    texts = Texts(seed=rng.randrange(1 << 30))
    ops: list[Op] = []
    shared = Shared()
    kill_after = rng.uniform(0.05, max_kill_s)
    victim = rng.randrange(nodes) if nodes > 1 else 0  # (the DuckDB trials draw exactly as before)
    # Fault "stop": another node (one that is not killed) is frozen with SIGSTOP for a while
    # within the load, then resumed: live by its heartbeat for up to 10 s, unable to acknowledge.
    stop_plan: tuple[int, float, float] | None = None
    if "stop" in faults:
        others = [k for k in range(nodes) if k != victim]
        stop_plan = (rng.choice(others), rng.uniform(0.0, kill_after), rng.uniform(0.5, 3.0))
    db_url: str | None = None
    node_args = StoreArgs()
    node_dirs = [data_dir]
    if store is not None:
        from engram_memory.store.postgres.databases import create_database  # psycopg: the postgres extra

        data_dir.mkdir(parents=True)
        db_url = create_database(store, f"engram_crash_s{seed}_t{trial}")
        (data_dir / "store.url").write_text(db_url + "\n")  # a failed trial keeps its database: named here
        init_store(db_url, data_dir / "master.key")
        node_args = StoreArgs(db_url, data_dir / "master.key")
        node_dirs = [data_dir / f"node-{k}" for k in range(nodes)]

    def node_env(k: int) -> dict[str, str] | None:
        # Names the node's PostgreSQL sessions, so the harness can wait for a killed node's to end.
        return None if db_url is None else {"PGAPPNAME": f"engram-crash-node-{k}"}

    def target_of(url: str) -> Target:
        return Target(url, KID, (keys_dir / f"{KID}.private.pem").read_bytes(),
                      (keys_dir / f"{KID}.token").read_text().strip(), read_audience(keys_dir / "host-keys.toml"))

    t0 = time.perf_counter()
    in_flight: dict[str, int] = {}
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:  # (on an error mid-trial, the finally below leaves no server running)
        for k, node_dir in enumerate(node_dirs):
            proc, url = start_server(node_dir, keys_dir, log, node_args, node_env(k))
            procs.append(proc)
            urls.append(url)

        async def load() -> None:
            go = anyio.Event()
            all_ready = anyio.Event()
            connected = [0]

            def ready() -> None:
                connected[0] += 1
                if connected[0] >= clients:
                    all_ready.set()

            async def conductor() -> None:
                await all_ready.wait()
                go.set()
                await anyio.sleep(kill_after)
                in_flight.update({k: v for k, v in shared.in_flight.items() if v})
                procs[victim].kill()  # SIGKILL: no handler, no flush, no goodbye
                await anyio.to_thread.run_sync(procs[victim].wait)
                shared.killed = True

            async def freezer(node: int, after: float, seconds: float) -> None:
                await go.wait()
                await anyio.sleep(after)
                procs[node].send_signal(signal.SIGSTOP)
                try:
                    await anyio.sleep(seconds)
                finally:
                    procs[node].send_signal(signal.SIGCONT)

            targets = [target_of(url) for url in urls]
            async with anyio.create_task_group() as tg:
                tg.start_soon(conductor)
                if stop_plan is not None:
                    tg.start_soon(freezer, *stop_plan)
                for i in range(clients):
                    tg.start_soon(load_client, targets[i % nodes], i, random.Random(f"{seed}:{trial}:{i}"), texts,
                                  prefix, ops, shared, ready, go)

        # Fault "reader": a backup's long REPEATABLE READ transaction holds data_keys all through
        # the load (the key table's vacuum must neither stall a node's heartbeat nor its key loads).
        reader = _long_reader(db_url) if "reader" in faults and db_url is not None else None
        try:
            anyio.run(load)
        finally:
            if reader is not None:
                reader.close()
            for proc in procs:
                proc.send_signal(signal.SIGCONT)  # a load that failed with a node still frozen
            if procs[victim].poll() is None:
                procs[victim].kill()
                procs[victim].wait()
        if db_url is not None and not wait_disconnected(db_url, f"engram-crash-node-{victim}"):
            raise RuntimeError("PostgreSQL kept the killed node's sessions for 60 s")
        before_kill = ledger_keys(db_url if db_url is not None else data_dir)
        unanswered = [op for op in ops if not op.answered_in_load()]

        def restart() -> TrialResult | None:
            try:
                procs[victim], urls[victim] = start_server(node_dirs[victim], keys_dir, log, node_args,
                                                           node_env(victim))
            except RuntimeError:
                return TrialResult(trial, False, time.perf_counter() - t0, kill_after, len(ops), shared.calls, 0, 0,
                                   in_flight, any(in_flight.values()), 0, 0, {}, ["the server did not restart after "
                                                                                  f"the kill; see {log}"])
            return None

        if nodes == 1 and (failed := restart()) is not None:
            return failed, ops, before_kill
        failures: list[str] = []
        # With several nodes the killed one stays down while the others take the retries.
        serving = [k for k in range(nodes) if nodes == 1 or k != victim]

        async def recover() -> None:
            async with anyio.create_task_group() as tg:
                for i in range(clients):
                    home = i % nodes
                    node = home if home in serving else serving[i % len(serving)]
                    tg.start_soon(recovery_client, target_of(urls[node]), i, random.Random(f"{seed}:{trial}:{i}:r"),
                                  prefix, ops, shared)

        try:
            anyio.run(recover)
        except Exception as exc:  # noqa: BLE001 - reported as the trial's failure
            failures.append(f"recovery failed: {type(exc).__name__}: {exc}")
        if nodes > 1 and (failed := restart()) is not None:
            return failed, ops, before_kill
        drained: float | None = None
        if db_url is not None:  # every node, the restarted one too, serves exactly what the answers imply
            try:
                anyio.run(read_back, [target_of(u) for u in urls], prefix, ops, shared)
            except Exception as exc:  # noqa: BLE001 - reported as the trial's failure
                failures.append(f"read-back failed: {type(exc).__name__}: {exc}")
            if faults:
                drained, left = _drain(db_url, DRAIN_BOUND_S)
                if left:
                    failures.append(f"every node healthy, {left} after {DRAIN_BOUND_S:.0f} s")
        codes = [stop_server(proc) for proc in procs]
        # -SIGTERM: uvicorn re-raises the signal after its graceful shutdown, ending the process before
        # the engine closes (reported as a defect); the store must survive that too, so it is no failure.
        bad = [c for c in codes if c not in (0, -signal.SIGTERM)]
        code = bad[0] if bad else max(codes, key=abs)
        if bad:
            failures.append(f"the recovered server exited with {bad[0]} when stopped")
        failures += shared.read_failures
        failures += check_answers(ops, before_kill)
        failures += check_store(db_url if db_url is not None else data_dir, ops)
        if db_url is None:
            report = verify_store(data_dir)
            failures += [f"verify: {p}" for p in report.problems]
            verified = {"ok": report.ok, "code": report.code, "events": sum(s.events for s in report.scopes),
                        "projections": [s.projection for s in report.scopes]}
        else:
            from engram_memory.checks.pg_verify import verify_pg_store

            assert node_args.master_key_file is not None
            pg = verify_pg_store(db_url, node_args.master_key_file, node_dirs, data_dir / "verify")
            failures += [f"verify: {p}" for p in pg.problems]
            verified = {"ok": pg.ok, "code": None, "events": pg.events, "projections": pg.projections,
                        "orphan_keys": pg.orphan_keys}
        retries = sum(_retries(op) for op in unanswered)
        replays = sum(max(0, len(op.definitive()) - 1) for op in ops)
        unknown_applied = sum(1 for op in unanswered if committed(op) and ledger_id(op) in before_kill)
        unknown_fresh = sum(1 for op in unanswered if committed(op) and ledger_id(op) not in before_kill)
        result = TrialResult(
            trial=trial, ok=not failures, seconds=time.perf_counter() - t0, kill_after_s=kill_after,
            operations=len(ops), calls=shared.calls, retries=retries, replays=replays, in_flight_at_kill=in_flight,
            mid_write=any(v for v in in_flight.values()), unknown_applied=unknown_applied,
            unknown_not_applied=unknown_fresh,
            indefinite_codes=dict(Counter(a.code or "" for op in ops for a in op.attempts
                                          if a.outcome == "indefinite")),
            by_tool=dict(Counter(op.tool for op in ops)), failures=failures, stop_exit=code,
            pending_after_recovery=sum(1 for op in ops if committed(op) and _still_pending(op)),
            verify=verified, killed_node=victim, nodes=nodes, faults=list(faults),
            stopped_node=stop_plan[0] if stop_plan else None, stopped_s=round(stop_plan[2], 2) if stop_plan else 0.0,
            drained_s=None if drained is None else round(drained, 2),
        )
        if result.ok and not keep:
            shutil.rmtree(data_dir, ignore_errors=True)
            log.unlink(missing_ok=True)
            if db_url is not None and store is not None:
                from engram_memory.store.postgres.databases import drop_database

                drop_database(store, db_url)
        return result, ops, before_kill
    finally:
        for proc in procs:  # on an error mid-trial, no server outlives it
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _long_reader(url: str) -> Any:
    """An open REPEATABLE READ transaction that has read ``data_keys`` (as pg_dump's does)."""
    import psycopg

    conn = psycopg.connect(url)
    conn.execute(b"BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.execute(b"SELECT count(*) FROM data_keys").fetchone()
    return conn


def _drain(url: str, bound: float) -> tuple[float, str]:
    """With every node up: the seconds until no withdraw/forget answer says "pending" and no data
    key a pending or completed answer named is left in ``data_keys``; what is left at ``bound``."""
    import psycopg

    pending = ("SELECT count(*) FROM idempotency WHERE (tool = 'withdraw' AND strpos(value, "
               "'\"key_destruction\":\"pending\"') > 0) OR (tool = 'forget' AND strpos(value, "
               "'\"projection_invalidation\":\"pending\"') > 0)")
    owed = "SELECT count(*) FROM idempotency i JOIN data_keys d USING (key_ref)"
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            counts = [int(conn.execute(q.encode()).fetchone()[0]) for q in (pending, owed)]  # type: ignore[index]
            if counts == [0, 0] or time.perf_counter() - started > bound:
                break
            time.sleep(0.25)
    names = ("answers still pending", "data keys of withdrawn or forgotten items left")
    left = ", ".join(f"{n} {what}" for n, what in zip(counts, names, strict=True) if n)
    return time.perf_counter() - started, left


async def read_back(targets: list[Target], prefix: str, ops: list[Op], shared: Shared) -> None:
    """On every node and in every tenant: each admitted record is readable exactly when it was not
    forgotten, and a search matching every record finds exactly the current ones (all pages)."""
    import anyio

    from engram_memory.models.limits import LIMIT_MAX

    admitted: dict[str, set[str]] = {t: set() for t in TENANTS}
    forgotten: set[str] = set()
    for op in ops:
        if not committed(op):
            continue
        value = op.final().value or {}  # type: ignore[union-attr]
        if op.tool == "request_admission" and value["outcome"].get("record_id"):
            admitted[op.tenant].add(value["outcome"]["record_id"])
        elif op.tool == "forget":
            forgotten.add(op.args["record_id"])
    for k, target in enumerate(targets):
        for tenant in TENANTS:
            async with connect(target, tenant, f"{prefix}-readback") as host:
                for rid in sorted(admitted[tenant]):
                    with anyio.fail_after(CALL_TIMEOUT_S):
                        env = await host.call("get", {"record_id": rid, "purpose_ref": PURPOSE})
                    got = "ok" if env.get("ok") else str((env.get("error") or {}).get("code"))
                    expected = "NOT_FOUND" if rid in forgotten else "ok"
                    if got != expected:
                        shared.read_failures.append(f"node {k}: get {rid} answered {got}, expected {expected}")
                found: set[str] = set()
                args: dict[str, Any] = {"query": "note", "purpose_ref": PURPOSE, "limit": LIMIT_MAX}
                for _page in range(100):
                    with anyio.fail_after(CALL_TIMEOUT_S):
                        env = await host.call("search", args)
                    if not env.get("ok"):
                        shared.read_failures.append(f"node {k}: search in {tenant} answered "
                                                    f"{(env.get('error') or {}).get('code')}")
                        break
                    value = env["output"]["value"]
                    found |= {p["record"]["record_id"] for p in value["records"]}
                    if "next_page_cursor" not in value:
                        break
                    args = {**args, "page_cursor": value["next_page_cursor"]}
                current = admitted[tenant] - forgotten
                if found != current:
                    shared.read_failures.append(
                        f"node {k}: search in {tenant} found {len(found)} records, {len(found - current)} of them "
                        f"not current, and missed {len(current - found)} of the {len(current)} current ones")


def _still_pending(op: Op) -> bool:
    value = op.final().value or {}  # type: ignore[union-attr]
    return "pending" in (value.get("key_destruction"), value.get("projection_invalidation"))


def _retries(op: Op) -> int:
    """Recovery sends of an operation up to its first definitive answer (later ones are replays)."""
    sent = 0
    for attempt in op.attempts:
        if attempt.phase == "recovery":
            sent += 1
            if attempt.outcome != "indefinite":
                break
    return sent


# ---- the command --------------------------------------------------------------------------------


def totals(results: list[TrialResult], seconds: float) -> dict[str, Any]:
    return {
        "trials": len(results),
        "survived": sum(r.ok for r in results),
        "failed": [r.trial for r in results if not r.ok],
        "operations": sum(r.operations for r in results),
        "calls": sum(r.calls for r in results),
        "kills_mid_write": sum(r.mid_write for r in results),
        "unknown_applied_before_kill": sum(r.unknown_applied for r in results),
        "unknown_applied_by_retry": sum(r.unknown_not_applied for r in results),
        "retries": sum(r.retries for r in results),
        "replays": sum(r.replays for r in results),
        "clean_stops": sum(r.stop_exit == 0 for r in results),
        "pending_after_recovery": sum(r.pending_after_recovery for r in results),
        "indefinite_codes": dict(sum((Counter(r.indefinite_codes) for r in results), Counter()).most_common()),
        "seconds": seconds,
        **_shared_totals(results),
    }


def _shared_totals(results: list[TrialResult]) -> dict[str, Any]:
    """On PostgreSQL: which node each kill hit, and the data keys left unreferenced (a key is
    committed before the mutation that uses it; the sweep spares young ones, see pg_verify)."""
    if not results or results[0].verify is None or "orphan_keys" not in results[0].verify:
        return {}
    return {"kills_by_node": dict(sorted(Counter(f"node {r.killed_node} of {r.nodes}" for r in results).items())),
            "orphan_keys_left": sum((r.verify or {}).get("orphan_keys", 0) for r in results)}


SUMMARY_ROWS = (("trials", "trials"), ("survived", "trials survived"), ("operations", "logical operations"),
                ("calls", "calls sent"), ("kills_mid_write", "kills with a mutation in flight"),
                ("unknown_applied_before_kill", "unanswered, committed before the kill"),
                ("unknown_applied_by_retry", "unanswered, applied by the retry"),
                ("retries", "retries after restart"), ("replays", "replays (same key, after an answer)"),
                ("clean_stops", "SIGTERM stops that closed the engine (exit 0)"),
                ("pending_after_recovery", "withdraw/forget answers still 'pending' after recovery"),
                ("seconds", "seconds"))


def render(summary: dict[str, Any], results: list[TrialResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    table = Table(title=f"crash: {summary['survived']}/{summary['trials']} trials survived")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key, label in SUMMARY_ROWS:
        value = summary[key]
        table.add_row(label, f"{value:,.1f}" if isinstance(value, float) else f"{value:,}")
    if "kills_by_node" in summary:
        table.add_row("kills by node", ", ".join(f"{k}: {v}" for k, v in summary["kills_by_node"].items()))
        table.add_row("data keys left unreferenced (young: the sweep spares them)", f"{summary['orphan_keys_left']:,}")
    if summary.get("indefinite_codes"):
        table.add_row("no-answer kinds", ", ".join(f"{k} {v}" for k, v in summary["indefinite_codes"].items()))
    console.print(table)
    for r in results:
        if not r.ok:
            console.print(f"trial {r.trial} FAILED: " + "; ".join(r.failures[:5]))


def run_crash(trials: int, seed: int, clients: int, out: Path, max_kill_s: float = 1.5, keep: bool = False,
              progress: bool = True, argv: list[str] | None = None, store: str | None = None,
              nodes: int = 1, faults: tuple[str, ...] = ()) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    out.mkdir(parents=True, exist_ok=True)
    results: list[TrialResult] = []
    t0 = time.perf_counter()
    summary: dict[str, Any] = {}
    columns = (TextColumn("crash trials"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[status]}"))
    with tempfile.TemporaryDirectory(prefix="engram-crash-") as tmp, \
            Progress(*columns, console=Console(stderr=True), disable=not progress) as bar:
        keys_dir = Path(tmp) / "keys"
        make_keys(keys_dir)
        work = out / "trials"
        work.mkdir(exist_ok=True)
        task = bar.add_task("trials", total=trials, status="")
        for trial in range(trials):
            result, _ops, _before = run_trial(trial, seed, clients, keys_dir, work, max_kill_s, keep, store, nodes,
                                              faults)
            results.append(result)
            summary = totals(results, time.perf_counter() - t0)
            bar.update(task, advance=1, status=f"{summary['survived']} survived, {summary['operations']} ops, "
                       f"{summary['kills_mid_write']} mid-write")
            write(out, argv, seed, clients, summary, results, "postgresql" if store else "duckdb", nodes)
    if not any(work.iterdir()):
        work.rmdir()
    return {"totals": summary, "results": results}


def write(out: Path, argv: list[str] | None, seed: int, clients: int, summary: dict[str, Any],
          results: list[TrialResult], backend: str = "duckdb", nodes: int = 1) -> None:
    doc = {"command": ["engram-memory", "crash", *(argv or [])], "seed": seed, "clients": clients,
           "backend": backend, "nodes": nodes, "totals": summary, "trials": [r.as_dict() for r in results]}
    (out / "crash.json").write_text(json.dumps(doc, indent=1) + "\n")


def crash_cmd(
    out: Annotated[Path, Opt("--out", help="Output dir: crash.json, and the data dir and log of any failed trial.",
                             file_okay=False)],
    trials: Annotated[int, Opt("--trials", min=1, help="Kill-and-recover trials.")] = 100,
    seed: Annotated[int, Opt("--seed", help="Seeds the load, the kill moments and the replays.")] = 1,
    clients: Annotated[int, Opt("--clients", min=1, max=64, help="Concurrent signing clients per trial.")] = 4,
    transport: Annotated[str, Opt("--transport", help="Transport to the server (http: several signing "
                                  "clients on one server).")] = "http",
    max_kill_s: Annotated[float, Opt("--max-kill-s", min=0.01, help="The kill comes uniformly within this many "
                                     "seconds of the load's start.")] = 1.5,
    keep: Annotated[bool, Opt("--keep/--no-keep", help="Keep every trial's data dir (failed ones are always "
                                                       "kept).")] = False,
    as_json: Annotated[bool, Opt("--json", help="Print crash.json's totals as JSON on stdout.")] = False,
    progress: Annotated[bool, Opt("--progress/--no-progress", help="Progress bar on stderr.")] = True,
    store: Annotated[str | None, Opt("--store", help="Run on PostgreSQL: a libpq URL (no password) of a role that "
                                     "may CREATE DATABASE. Each trial gets a fresh database, initialised with "
                                     "admin init-store, dropped when the trial passes (kept when it fails).")] = None,
    nodes: Annotated[int, Opt("--nodes", min=1, max=8, help="Servers on the one PostgreSQL store; clients spread "
                              "over them, one is killed, the others take the retries (needs --store).")] = 1,
    faults: Annotated[str, Opt("--faults", help="Comma-separated, besides the kill (needs --nodes 2 or more): "
                               "stop (SIGSTOP another node for 0.5-3 s), reader (a REPEATABLE READ transaction "
                               "holds data_keys through the load). Then, with every node up, no answer may stay "
                               "pending nor any owed data key remain for more than 30 s.")] = "",
) -> None:
    """SIGKILL the real server under concurrent mutations; recover, retry with the same keys, check."""
    try:
        if transport != "http":
            raise UsageError(f"--transport {transport}: only http is supported (several clients on one server)")
        if nodes > 1 and store is None:
            raise UsageError(f"--nodes {nodes} needs --store URL (a DuckDB store is served by one process)")
        chosen = tuple(f.strip() for f in faults.split(",") if f.strip())
        unknown = [f for f in chosen if f not in FAULTS]
        if unknown:
            raise UsageError(f"--faults {unknown[0]}: choose among {', '.join(FAULTS)}")
        if chosen and nodes < 2:
            raise UsageError("--faults needs --nodes 2 or more (and --store URL)")
        if store is not None:
            check_admin_url(store)
        result = run_crash(trials, seed, clients, out, max_kill_s, keep, progress,
                           sys.argv[2:] if len(sys.argv) > 2 else [], store, nodes, chosen)
    except (UsageError, BenchUsageError) as exc:
        sys.stderr.write(f"engram-memory: error: {exc}\n")
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        sys.stderr.write(f"engram-memory: crash interrupted; trials finished so far are in {out / 'crash.json'}\n")
        raise typer.Exit(130) from None
    if as_json:
        sys.stdout.write(json.dumps(result["totals"], indent=1) + "\n")
    else:
        render(result["totals"], result["results"])
    sys.stderr.write(f"wrote {out / 'crash.json'}\n")
    if result["totals"]["survived"] != result["totals"]["trials"]:
        raise typer.Exit(1)
