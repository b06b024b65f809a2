"""Several ``serve --http`` nodes on one PostgreSQL store (issue 22 §4-§6): real node processes,
one fresh database initialised by the real ``admin init-store``, the real MCP SDK client with
signed contexts, and PostgreSQL itself read back to count effects."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import jwt
import psycopg
import pytest

from engram_memory.models.hostauth import CONTEXT_META_KEY
from engram_memory.store.postgres.backend import NODE_LIVE_S, POLL_S, PostgresStore
from tests.conftest import capture_args, fresh_database, get_args, key, search_args
from tests.http_fixtures import HostKit, HttpServer, SignedClient, free_port, host_context, signed_client, wait_healthy
from tests.test_e2e_http import admit, assert_context_refused, forget_args, search_ids, withdraw_args

pytestmark = pytest.mark.anyio

HYBRID = {"minimum_channels": "lexical_and_semantic", "network": "forbid"}


class Cluster:
    """Nodes of one PostgreSQL store: each its own data dir, all started with the same master key."""

    def __init__(self, url: str, root: Path, kit: HostKit, env: dict[str, str]) -> None:
        self.url, self.root, self.kit, self.env = url, root, kit, env
        self.key_file = root / "master.key"
        init = subprocess.run([sys.executable, "-m", "engram_memory.server.cli", "admin", "init-store",
                               "--store", url, "--master-key-out", str(self.key_file)],
                              env=env, capture_output=True, text=True, timeout=60)
        assert init.returncode == 0, init.stderr
        self.nodes: dict[str, HttpServer] = {}

    def start(self, name: str, *, semantic: bool = False) -> HttpServer:
        """Start (or restart, same data dir: same node id) node ``name`` and wait until it is healthy."""
        data_dir = self.root / name
        port = free_port()
        argv = [sys.executable, "-m", "engram_memory.server.cli", "serve", "--http", f"127.0.0.1:{port}",
                "--data-dir", str(data_dir), "--host-keys", str(self.kit.host_keys),
                "--store", self.url, "--master-key-file", str(self.key_file), "--log-level", "DEBUG"]
        if not semantic:
            argv.append("--no-semantic")
        err_path = self.root / f"{name}-{port}.stderr"
        with err_path.open("w") as err:
            proc = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=err)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(base, proc)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        node = self.nodes[name] = HttpServer(base + "/mcp", base, proc, data_dir, err_path)
        return node

    def stop(self, name: str) -> None:
        """A graceful stop (SIGTERM): exit 0."""
        proc = self.nodes.pop(name).proc
        proc.terminate()
        assert proc.wait(timeout=30) == 0, f"node {name} exited {proc.returncode} on SIGTERM"

    def kill(self, name: str) -> None:
        proc = self.nodes.pop(name).proc
        proc.kill()
        proc.wait(timeout=30)

    def close(self) -> None:
        for name, node in list(self.nodes.items()):
            node.proc.send_signal(signal.SIGCONT)  # a test that failed while a node was stopped
            self.stop(name)

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(sql.encode(), params).fetchall()

    def count(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        return int(self.rows(sql, params)[0][0])

    def trio(self) -> tuple[HttpServer, HttpServer, HttpServer]:
        return self.nodes["a"], self.nodes["b"], self.nodes["c"]

    def verify_journal(self, scope_ref: str) -> bool:
        """The hash chain, checked by the store itself (a short-lived node of its own)."""
        store = PostgresStore(self.url, self.key_file.read_bytes(), self.root / "verifier", key_file=self.key_file)
        try:
            return store.verify_journal(scope_ref)
        finally:
            store.close()


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> HostKit:
    kit = HostKit(tmp_path_factory.mktemp("pg-node-keys"))
    kit.add("host-a")
    return kit


@pytest.fixture(scope="module")
def module_trio(pg_url: str, tmp_path_factory: pytest.TempPathFactory, kit: HostKit,
         offline_env: dict[str, str]) -> Iterator[Cluster]:
    """Three lexical nodes a, b, c on one store, shared by the tests that stop none of them for
    good; each such test works in a tenant of its own."""
    with fresh_database(pg_url, "nodes") as url:
        c = Cluster(url, tmp_path_factory.mktemp("trio"), kit, offline_env)
        try:
            for name in "abc":
                c.start(name)
            yield c
        finally:
            c.close()


@pytest.fixture
def trio(module_trio: Cluster) -> Cluster:
    """The module's trio, whole again: a test that kills or stops a node restarts it, but one that
    failed half-way may not have."""
    for name in "abc":
        if name not in module_trio.nodes:
            module_trio.start(name)
    return module_trio


@pytest.fixture
def cluster(pg_database: str, tmp_path: Path, kit: HostKit, offline_env: dict[str, str]) -> Iterator[Cluster]:
    """A store of its own, no node started yet."""
    c = Cluster(pg_database, tmp_path, kit, offline_env)
    try:
        yield c
    finally:
        c.close()


def jti(meta: dict[str, Any]) -> str:
    return str(jwt.decode(meta[CONTEXT_META_KEY], options={"verify_signature": False})["jti"])


def scope(tenant: str) -> str:
    return f"tenant:{tenant}/workspace:ws-1"


def client(node: HttpServer, kit: HostKit, tenant: str = "tenant-a") -> Any:
    return signed_client(node.url, kit, "host-a", host_context(tenant=tenant))


def value(envelope: dict[str, Any]) -> dict[str, Any]:
    assert envelope["ok"], envelope
    return dict(envelope["output"]["value"])


def canonical(v: dict[str, Any]) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


async def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, f"not reached within {timeout} s: {what}"
        await anyio.sleep(0.2)


async def both(first: Any, second: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two calls started together (one per node); their envelopes."""
    out: dict[int, dict[str, Any]] = {}

    async def run(i: int, call: Any) -> None:
        out[i] = await call

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, 0, first)
        tg.start_soon(run, 1, second)
    return out[0], out[1]


async def attempt(node: HttpServer, kit: HostKit, tenant: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """One call in a session of its own (a node that dies takes only this session with it)."""
    with anyio.fail_after(20):
        async with client(node, kit, tenant) as c:
            return await c.call(tool, args)


async def assert_gone(c: SignedClient, record_id: str, query: str) -> None:
    assert record_id not in search_ids(await c.call("search", search_args(query)))
    got = await c.call("get", get_args(record_id))
    assert got["error"]["code"] == "NOT_FOUND", got


# ---- writes on one node, reads on another ------------------------------------------------------


async def test_writes_on_one_node_are_read_at_once_on_the_others(trio: Cluster, kit: HostKit) -> None:
    a, b, c, t = *trio.trio(), "rw"
    async with client(a, kit, t) as on_a, client(b, kit, t) as on_b, client(c, kit, t) as on_c:
        # B and C hold projections of the scope before A writes: they must catch up, not just build.
        assert search_ids(await on_b.call("search", search_args("osprey"))) == []
        assert search_ids(await on_c.call("search", search_args("osprey"))) == []
        for i in range(3):
            record_id = await admit(on_a, f"Osprey survey {i}: the north marsh count moves to Tuesdays.")
            # Right after A answered, with no wait: read-your-writes across nodes.
            assert record_id in search_ids(await on_b.call("search", search_args(f"osprey survey {i}")))
            got = value(await on_c.call("get", get_args(record_id)))
            assert got["record"]["record_id"] == record_id
            assert got["record"]["components"][0]["text"].startswith(f"Osprey survey {i}")
        # And the other way round: B writes, A and C read.
        record_id = await admit(on_b, "Heron nests are counted by the south team.")
        assert search_ids(await on_a.call("search", search_args("heron nests"))) == [record_id]
        assert value(await on_c.call("get", get_args(record_id)))["record"]["record_id"] == record_id
    assert trio.count("SELECT count(*) FROM records WHERE scope_ref = %s", (scope(t),)) == 4
    assert trio.verify_journal(scope(t))


async def test_a_context_used_on_one_node_is_refused_by_another(trio: Cluster, kit: HostKit) -> None:
    a, b, _ = trio.trio()
    async with client(a, kit, "replay") as on_a, client(b, kit, "replay") as on_b:
        meta = on_a.meta()
        assert (await on_a.raw("search", search_args("replay"), meta)).structured_content["ok"]  # type: ignore[index]
        await assert_context_refused(on_b, "search", search_args("replay"), meta)  # the shared replay table
        await assert_context_refused(on_a, "search", search_args("replay"), meta)
        assert (await on_b.call("search", search_args("replay")))["ok"]  # a fresh context is fine
    assert trio.count("SELECT count(*) FROM replay WHERE jti = %s", (jti(meta),)) == 1


async def test_a_search_paged_on_one_node_continues_on_the_others(trio: Cluster, kit: HostKit) -> None:
    """Behind a load balancer the next page may go to any node: the page-cursor key is the store's."""
    a, b, c, t = *trio.trio(), "paging"
    async with client(a, kit, t) as on_a, client(b, kit, t) as on_b, client(c, kit, t) as on_c:
        admitted = {await admit(on_a, f"Lapwing plot {i} was ploughed late this year.") for i in range(5)}
        pages: list[list[str]] = []
        cursor: str | None = None
        for node in (on_b, on_c, on_a):
            extra = {"page_cursor": cursor} if cursor else {}
            page = value(await node.call("search", search_args("lapwing plot ploughed", limit=2, **extra)))
            pages.append([p["record"]["record_id"] for p in page["records"]])
            cursor = page.get("next_page_cursor")
        assert [len(p) for p in pages] == [2, 2, 1] and cursor is None
        assert sorted(sum(pages, [])) == sorted(admitted)


# ---- the same key on two nodes at once -----------------------------------------------------------


async def test_the_same_key_on_two_nodes_at_once_has_one_effect(trio: Cluster, kit: HostKit) -> None:
    a, b, _ = trio.trio()
    t = "same-key"
    async with client(a, kit, t) as on_a, client(b, kit, t) as on_b:
        for i in range(4):
            args = capture_args(f"Kingfisher ringing round {i} moves to the weir.", key=key(f"cap{i}"))
            first, second = await both(on_a.call("capture", args), on_b.call("capture", args))
            caps = sorted([value(first), value(second)], key=lambda v: v["status"])
            assert [v["status"] for v in caps] == ["committed_pending", "duplicate_exact"]
            # The replay is the first answer, byte for byte, but for its status (TOOL_CONTRACT).
            assert canonical({**caps[1], "status": "committed_pending"}) == canonical(caps[0])
            cid = caps[0]["candidate_id"]

            adm = {"candidate_id": cid, "idempotency_key": key(f"adm{i}")}
            first, second = await both(on_a.call("request_admission", adm), on_b.call("request_admission", adm))
            adms = sorted([value(first), value(second)], key=lambda v: v["replayed"])
            assert [v["replayed"] for v in adms] == [False, True]
            assert adms[0]["outcome"]["status"] == "accepted"
            assert canonical(adms[1]["outcome"]) == canonical(adms[0]["outcome"])

            # Another key for the decided candidate, on both at once: the same decision, no new event.
            again = [{"candidate_id": cid, "idempotency_key": key(f"re{i}{n}")} for n in range(2)]
            first, second = await both(on_a.call("request_admission", again[0]),
                                       on_b.call("request_admission", again[1]))
            for v in (value(first), value(second)):
                assert v["outcome"] == {**adms[0]["outcome"], "status": "duplicate_exact"}
            record_id = adms[0]["outcome"]["record_id"]
            assert search_ids(await on_b.call("search", search_args(f"kingfisher round {i}")))[0] == record_id
    # Exactly one effect each: one capture and one accept event per candidate, one row per thing.
    assert trio.rows("SELECT operation, count(*) FROM journal WHERE scope_ref = %s GROUP BY 1 ORDER BY 1",
                     (scope(t),)) == [("accept", 4), ("capture", 4)]
    assert trio.count("SELECT count(*) FROM candidates WHERE scope_ref = %s", (scope(t),)) == 4
    assert trio.count("SELECT count(*) FROM records WHERE scope_ref = %s", (scope(t),)) == 4
    # A capture and an admission key each; a duplicate_exact under another key is not bound to it.
    assert trio.count("SELECT count(*) FROM idempotency WHERE scope_ref = %s", (scope(t),)) == 4 + 4
    assert trio.verify_journal(scope(t))


async def test_an_admission_and_a_withdraw_racing_on_two_nodes_have_one_winner(trio: Cluster, kit: HostKit) -> None:
    a, b, c, t = *trio.trio(), "race"
    admitted: list[str] = []
    async with client(a, kit, t) as on_a, client(b, kit, t) as on_b, client(c, kit, t) as on_c:
        for i in range(3):
            cid = value(await on_c.call("capture", capture_args(f"Snipe drumming heard at dusk, night {i}.")))
            adm, wd = await both(on_a.call("request_admission", {"candidate_id": cid["candidate_id"],
                                                                 "idempotency_key": key("race-adm")}),
                                 on_b.call("withdraw", withdraw_args(cid["candidate_id"])))
            assert adm["ok"] != wd["ok"], (adm, wd)  # exactly one of them took the pending candidate
            if adm["ok"]:
                assert value(adm)["outcome"]["status"] == "accepted"
                assert wd["error"]["code"] == "ILLEGAL_TRANSITION", wd  # as on one node
            else:
                assert adm["error"]["code"] == "NOT_FOUND", adm  # a withdrawn candidate is not found
                assert value(wd)["key_destruction"] == "complete"
            admitted += [value(adm)["outcome"]["record_id"]] if adm["ok"] else []
            assert sorted(search_ids(await on_c.call("search", search_args("snipe drumming")))) == sorted(admitted)
    events = trio.rows("SELECT operation FROM journal WHERE scope_ref = %s ORDER BY cursor", (scope(t),))
    assert len(events) == 6 and all(op in ("accept", "withdraw") for (op,) in events[1::2])
    assert trio.verify_journal(scope(t))


async def test_different_keys_from_three_nodes_at_once_keep_the_chain_dense(trio: Cluster, kit: HostKit) -> None:
    nodes, t = trio.trio(), "dense"
    per_node = 8
    admitted: list[str] = []

    async def writer(node: HttpServer, n: int) -> None:
        async with client(node, kit, t) as c:
            for i in range(per_node):
                admitted.append(await admit(c, f"Tern colony note {n}-{i}: nest {n * 100 + i} hatched."))

    async with anyio.create_task_group() as tg:
        for n, node in enumerate(nodes):
            tg.start_soon(writer, node, n)
    total = 2 * per_node * len(nodes)  # a capture and an accept each
    cursors = [c for (c,) in trio.rows("SELECT cursor FROM journal WHERE scope_ref = %s ORDER BY cursor",
                                       (scope(t),))]
    assert cursors == list(range(1, total + 1))
    assert trio.rows("SELECT high_water, projection_cursor FROM scopes WHERE scope_ref = %s",
                     (scope(t),)) == [(total, total)]
    assert trio.verify_journal(scope(t))
    # Every node serves every record, whichever node admitted it.
    for node in nodes:
        async with client(node, kit, t) as c:
            found = search_ids(await c.call("search", search_args("tern colony note hatched", limit=50)))
            assert sorted(found) == sorted(admitted)


# ---- forget on one node ----------------------------------------------------------------------------


async def test_forget_on_one_node_is_gone_everywhere_and_complete(trio: Cluster, kit: HostKit) -> None:
    a, b, c, t = *trio.trio(), "forget"
    async with client(a, kit, t) as on_a, client(b, kit, t) as on_b, client(c, kit, t) as on_c:
        record_id = await admit(on_a, "The egret roost under the bridge is closed to visitors.")
        kept = await admit(on_a, "The egret hide opens at dawn.")
        for n in (on_b, on_c):  # every node holds the record in its projections
            assert record_id in search_ids(await n.call("search", search_args("egret roost bridge")))
        forgot = value(await on_b.call("forget", forget_args(record_id)))
        # Every live node acknowledged the purge before B answered.
        assert forgot["projection_invalidation"] == "complete"
        assert forgot["coverage_receipt_digest"].startswith("sha256:")
        for n in (on_a, on_b, on_c):
            await assert_gone(n, record_id, "egret roost bridge")
            assert value(await n.call("get", get_args(kept)))["record"]["record_id"] == kept
    assert trio.rows("SELECT state, key_ref, body FROM records WHERE record_id = %s",
                     (record_id,)) == [("tombstoned", None, None)]
    assert trio.verify_journal(scope(t))


async def test_forgets_on_two_nodes_at_once_both_complete(trio: Cluster, kit: HostKit) -> None:
    """Each node's forget waits for the other's acknowledgement: it must not hold the lock the
    other node needs to acknowledge (both answered "pending" after 2 s when the two forgets were
    in different scopes: neither node could purge the other's)."""
    a, b, _ = trio.trio()
    records: dict[str, str] = {}
    for t in ("forget-x", "forget-y"):
        async with client(a, kit, t) as on_a, client(b, kit, t) as on_b:
            records[t] = await admit(on_a, "The little grebe dives under the jetty.")
            for c in (on_a, on_b):  # both nodes hold both scopes' projections
                assert search_ids(await c.call("search", search_args("grebe"))) == [records[t]]
    async with client(a, kit, "forget-x") as on_a, client(b, kit, "forget-y") as on_b:
        started = time.monotonic()
        one, other = await both(on_a.call("forget", forget_args(records["forget-x"])),
                                on_b.call("forget", forget_args(records["forget-y"])))
        elapsed = time.monotonic() - started
        assert [value(one)["projection_invalidation"], value(other)["projection_invalidation"]] == ["complete"] * 2
    for t in ("forget-x", "forget-y"):
        async with client(a, kit, t) as on_a, client(b, kit, t) as on_b:
            for c in (on_a, on_b):
                await assert_gone(c, records[t], "grebe")
    assert elapsed < 2.0, f"the two forgets took {elapsed:.1f} s"


async def test_forget_while_a_node_is_stopped_is_pending_then_completes(trio: Cluster, kit: HostKit) -> None:
    a, b, _ = trio.trio()
    async with client(a, kit, "pending") as on_a, client(b, kit, "pending") as on_b:
        record_id = await admit(on_a, "The bittern was heard booming in the reed bed.")
        assert search_ids(await on_b.call("search", search_args("bittern booming"))) == [record_id]
        args = forget_args(record_id)
        b.proc.send_signal(signal.SIGSTOP)  # live (its heartbeat is recent) but cannot acknowledge
        try:
            forgot = value(await on_a.call("forget", args))
        finally:
            b.proc.send_signal(signal.SIGCONT)
        assert forgot["projection_invalidation"] == "pending"
        assert "coverage_receipt_digest" not in forgot
        await assert_gone(on_a, record_id, "bittern booming")
        await assert_gone(on_b, record_id, "bittern booming")  # B's first read after it resumed catches up

        async def completed() -> bool:
            replay = value(await on_a.call("forget", args))
            assert replay["replayed"] is True and replay["receipt"] == forgot["receipt"]
            return replay["projection_invalidation"] == "complete"

        # A completes its pending answer once B acknowledged (A's watcher re-checks each scope
        # every few seconds); then the replay, on any node, is the completed answer.
        await wait_until(completed, 20, "the pending forget completes once B acknowledged")
        replay = value(await on_b.call("forget", args))
        assert replay["projection_invalidation"] == "complete" and replay["replayed"] is True
        assert replay["coverage_receipt_digest"].startswith("sha256:")


@pytest.mark.slow
async def test_a_node_stopped_past_its_heartbeat_no_longer_holds_a_forget_back(trio: Cluster, kit: HostKit) -> None:
    """B is frozen longer than NODE_LIVE_S: A's pending forget completes without B (B is no longer
    live); B, resumed, catches up before it serves anything, so the record is gone there too."""
    a, b, _ = trio.trio()
    t = "frozen"
    async with client(a, kit, t) as on_a, client(b, kit, t) as on_b:
        record_id = await admit(on_a, "The nightjar churrs over the heath after sunset.")
        assert search_ids(await on_b.call("search", search_args("nightjar heath"))) == [record_id]
        args = forget_args(record_id)
        b.proc.send_signal(signal.SIGSTOP)
        try:
            assert value(await on_a.call("forget", args))["projection_invalidation"] == "pending"

            async def completed() -> bool:
                return value(await on_a.call("forget", args))["projection_invalidation"] == "complete"

            await wait_until(completed, NODE_LIVE_S + 3 * POLL_S, "A completes once B's heartbeat is stale")
            # B still holds the record in its projection files: it cannot have purged anything.
            assert trio.rows("SELECT cursor < (SELECT projection_cursor FROM scopes WHERE scope_ref = %s)"
                             " FROM node_cursors c JOIN nodes n USING (node_id) WHERE n.pid = %s AND scope_ref = %s",
                             (scope(t), b.proc.pid, scope(t))) == [(True,)]
        finally:
            b.proc.send_signal(signal.SIGCONT)
        await assert_gone(on_b, record_id, "nightjar heath")


async def test_a_pending_forget_of_a_node_that_left_is_completed_by_another(trio: Cluster, kit: HostKit) -> None:
    """The node that answered "pending" stops before it could complete: a replay on another node
    must not stay "pending" for ever (it did: only the answering node, or a restart, completed it)."""
    a, b, _ = trio.trio()
    t = "left"
    async with client(b, kit, t) as on_b:
        async with client(a, kit, t) as on_a:
            record_id = await admit(on_a, "The avocet scrape floods every spring tide.")
            assert search_ids(await on_b.call("search", search_args("avocet scrape"))) == [record_id]
            args = forget_args(record_id)
            b.proc.send_signal(signal.SIGSTOP)
            try:
                forgot = value(await on_a.call("forget", args))
                assert forgot["projection_invalidation"] == "pending"
                trio.stop("a")  # gone before B could acknowledge
            finally:
                b.proc.send_signal(signal.SIGCONT)
        await assert_gone(on_b, record_id, "avocet scrape")

        async def completed() -> bool:
            replay = value(await on_b.call("forget", args))
            assert replay["replayed"] is True and replay["receipt"] == forgot["receipt"]
            return replay["projection_invalidation"] == "complete"

        await wait_until(completed, 15, "B completes the pending forget A left behind")
    trio.start("a")


# ---- a node killed under load ------------------------------------------------------------------------


async def test_a_node_killed_under_load_loses_no_write_and_duplicates_none(trio: Cluster, kit: HostKit) -> None:
    """Writers send to A; A is SIGKILLed mid-load; every call A did not answer is retried on B with
    the same idempotency key; A restarts and catches up. One effect per key, nothing lost."""
    a, b, _ = trio.trio()
    t = "killed"
    ops, workers = 24, 4
    answered: dict[int, str] = {}  # op -> record_id
    on_b: dict[str, int] = {"capture": 0, "request_admission": 0}  # calls retried on B

    async def call(tool: str, args: dict[str, Any]) -> dict[str, Any]:
        if "a" in trio.nodes:
            try:
                envelope = await attempt(a, kit, t, tool, args)
            except Exception:  # noqa: BLE001 - A died before it answered (transport errors): the outcome is unknown
                envelope = None
            if envelope is not None:
                return value(envelope)  # an error envelope is a failure, never retried elsewhere
        on_b[tool] += 1
        # The retry: same tool, same key, same arguments (a replay if A committed before it died).
        return value(await attempt(b, kit, t, tool, args))

    async def writer(w: int) -> None:
        for i in range(w, ops, workers):
            cap = await call("capture", capture_args(f"Curlew count {i}: {i * 7} birds on the estuary.",
                                                     key=f"kill-cap-{i:04d}-0000000000"))
            adm = await call("request_admission", {"candidate_id": cap["candidate_id"],
                                                   "idempotency_key": f"kill-adm-{i:04d}-0000000000"})
            answered[i] = adm["outcome"]["record_id"]

    async def killer() -> None:
        while len(answered) < ops // 3:
            await anyio.sleep(0.02)
        trio.kill("a")

    async with anyio.create_task_group() as tg:
        tg.start_soon(killer)
        for w in range(workers):
            tg.start_soon(writer, w)
    assert len(answered) == ops and len(set(answered.values())) == ops
    assert on_b["capture"] + on_b["request_admission"] > 0, "A was killed after the load, not under it"
    # Exactly one effect per key, and the chain is whole.
    assert trio.rows("SELECT operation, count(*) FROM journal WHERE scope_ref = %s GROUP BY 1 ORDER BY 1",
                     (scope(t),)) == [("accept", ops), ("capture", ops)]
    assert trio.count("SELECT count(*) FROM idempotency WHERE scope_ref = %s", (scope(t),)) == 2 * ops
    assert sorted(r for (r,) in trio.rows("SELECT record_id FROM records WHERE scope_ref = %s", (scope(t),))) \
        == sorted(answered.values())
    assert [c for (c,) in trio.rows("SELECT cursor FROM journal WHERE scope_ref = %s ORDER BY cursor",
                                    (scope(t),))] == list(range(1, 2 * ops + 1))
    assert trio.verify_journal(scope(t))
    # The killed node restarts on its own data dir and serves every record, wherever it was admitted.
    a = trio.start("a")
    async with client(a, kit, t) as on_a:
        found = search_ids(await on_a.call("search", search_args("curlew count birds estuary", limit=50)))
        assert sorted(found) == sorted(answered.values())
        for record_id in answered.values():
            assert value(await on_a.call("get", get_args(record_id)))["record"]["record_id"] == record_id


async def test_an_admission_a_killed_node_committed_but_never_answered_is_replayed_by_another(
        trio: Cluster, kit: HostKit) -> None:
    """MUTATION_OUTCOME_UNKNOWN, made certain: A commits the admission, then waits on a lock the
    test holds (its projection acknowledgement) and is killed there. The retry on B, same key,
    answers the committed outcome (replayed) and B serves the record."""
    a, b, _ = trio.trio()
    t = "unknown"
    async with client(a, kit, t) as on_a:
        cid = value(await on_a.call("capture", capture_args("Godwit flocks roost on the spit at high water.")))
        # A has synced the scope once (its node_cursors row is written before its first sync), so
        # the lock below stops A at the acknowledgement after its commit, not before the admission.
        await on_a.call("search", search_args("godwit"))
    adm = {"candidate_id": cid["candidate_id"], "idempotency_key": key("adm-unknown")}
    with psycopg.connect(trio.url) as hold:  # one transaction until the with block ends
        hold.execute(b"LOCK TABLE node_cursors IN EXCLUSIVE MODE")
        failed: list[BaseException] = []

        async def on_a_call() -> None:
            try:
                await attempt(a, kit, t, "request_admission", adm)
            except Exception as exc:  # noqa: BLE001 - what the caller sees when the node dies mid-call
                failed.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(on_a_call)

            async def committed() -> bool:
                return trio.count("SELECT count(*) FROM journal WHERE scope_ref = %s AND operation = 'accept'",
                                  (scope(t),)) == 1

            await wait_until(committed, 20, "A commits the admission")
            await anyio.sleep(0.3)  # A is now past its commit, waiting for the lock
            trio.kill("a")
        assert len(failed) == 1, "A answered although it was killed before its answer"
    ledger = trio.rows("SELECT value FROM idempotency WHERE scope_ref = %s AND tool = 'request_admission'",
                       (scope(t),))
    assert len(ledger) == 1
    retry = value(await attempt(b, kit, t, "request_admission", adm))
    assert retry["replayed"] is True
    assert canonical(retry["outcome"]) == canonical(json.loads(ledger[0][0])["outcome"])
    assert retry["outcome"]["status"] == "accepted"
    record_id = retry["outcome"]["record_id"]
    async with client(b, kit, t) as on_b:
        assert search_ids(await on_b.call("search", search_args("godwit flocks spit"))) == [record_id]
    assert trio.rows("SELECT operation, count(*) FROM journal WHERE scope_ref = %s GROUP BY 1 ORDER BY 1",
                     (scope(t),)) == [("accept", 1), ("capture", 1)]
    a = trio.start("a")  # and A, restarted, catches up from the journal
    async with client(a, kit, t) as on_a:
        assert value(await on_a.call("get", get_args(record_id)))["record"]["record_id"] == record_id


# ---- the semantic channel: embeddings stored once --------------------------------------------------


async def test_a_record_admitted_on_one_node_is_found_by_meaning_on_another(cluster: Cluster, kit: HostKit) -> None:
    a, b = cluster.start("a", semantic=True), cluster.start("b", semantic=True)
    async with client(a, kit) as on_a, client(b, kit) as on_b:
        for c in (on_a, on_b):
            async def ready(c: SignedClient = c) -> bool:
                envelope = await c.call("search", search_args("warming up", capability_policy=HYBRID))
                if not envelope["ok"]:
                    assert envelope["error"]["code"] == "RANKING_UNAVAILABLE", envelope
                return bool(envelope["ok"])

            await wait_until(ready, 180, "the node's semantic channel is ready")
        record_id = await admit(on_a, "The river otter family was seen hunting eels below the mill.")
        # No word in common: only the semantic channel can find it, from the vector A stored.
        found = value(await on_b.call("search", search_args("aquatic mammals catching fish",
                                                            capability_policy=HYBRID)))
        assert found["rank_receipt"]["profile"] == "hybrid_v1"
        ranked = found["rank_receipt"]["ranked"]
        assert [r["record_id"] for r in ranked] == [record_id]
        assert "semantic" in ranked[0] and "lexical" not in ranked[0]
    assert cluster.count("SELECT count(*) FROM embeddings WHERE record_id = %s", (record_id,)) == 1
    assert "with no stored vector" not in b.stderr()  # B embedded nothing: it indexed the vector A stored
    assert "embedding 1 admitted record(s) with no stored vector" in a.stderr()  # A did, once
