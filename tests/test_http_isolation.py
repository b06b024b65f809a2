"""Isolation under load: one real HTTP server, many signing clients on many scopes at once.

Eight concurrent SDK clients (one anyio task group) capture, admit, search, get, forget and
retry for a bounded time. They cover: two clients on one tenant with different workspaces,
two clients on one tenant+workspace with different principals (they share the scope's
records), one workspace name reused under other tenants, and one principal name reused in
another tenant and in another workspace. Afterwards:

* no client ever saw a record of another scope (every search hit and every successful get is
  checked against the record ids each scope admitted);
* every idempotent retry converged (same candidate_id / record_id, ``duplicate_exact`` /
  ``replayed`` as the contract says);
* per scope, the records a fresh principal finds (search for every marker, paged, and a get
  of every admitted id) are exactly the admitted minus the forgotten.

The checks are pure functions over the observations; ``test_checkers_catch_violations``
feeds them a leak and a lost record so they are known to be able to fail.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import capture_args, get_args, search_args
from tests.http_fixtures import HostKit, HttpServer, SignedClient, host_context, http_server, signed_client

pytestmark = pytest.mark.anyio

LOAD_SECONDS = float(os.environ.get("ENGRAM_ISOLATION_SECONDS", "12"))
PAGE_LIMIT = 50  # the tool's maximum; the final census pages through everything
PACKET_BYTES = 1_048_576  # the largest page the tool allows

ScopeKey = tuple[str, str]  # (tenant, workspace)

# name, kid, tenant, workspace, principal, marker (a word only this client's texts contain)
CLIENTS: tuple[tuple[str, str, str, str, str, str], ...] = (
    ("c0", "host-a", "t-alpha", "ws-1", "p-anna", "isoalpha"),
    ("c1", "host-b", "t-alpha", "ws-2", "p-ben", "isobravo"),  # same tenant as c0, other workspace
    ("c2", "host-a", "t-beta", "ws-1", "p-cleo", "isocharlie"),
    ("c3", "host-b", "t-beta", "ws-1", "p-dev", "isodelta"),  # same scope as c2, other principal
    ("c4", "host-a", "t-gamma", "ws-1", "p-eli", "isoecho"),  # ws-1 again, under another tenant
    ("c5", "host-b", "t-delta", "ws-9", "p-fay", "isofoxtrot"),
    ("c6", "host-a", "t-epsilon", "ws-1", "p-anna", "isogolf"),  # c0's principal name, other tenant
    ("c7", "host-b", "t-beta", "ws-2", "p-cleo", "isohotel"),  # c2's principal, same tenant, other ws
)


@dataclass
class Probe:
    """One client's plan and everything it observed."""

    name: str
    kid: str
    tenant: str
    workspace: str
    principal: str
    marker: str
    captures: list[tuple[dict[str, Any], str]] = field(default_factory=list)  # (args, candidate_id)
    pending: list[str] = field(default_factory=list)  # captured, not yet admitted
    admissions: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)  # (args, outcome)
    admitted: list[str] = field(default_factory=list)
    forgotten: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)  # every record id any answer showed this client
    counts: Counter[str] = field(default_factory=Counter)
    serial: int = 0

    @property
    def scope(self) -> ScopeKey:
        return (self.tenant, self.workspace)

    def next(self, kind: str) -> str:
        self.serial += 1
        return f"iso-{self.name}-{kind}-{self.serial:06d}"


# ---- pure checks (tested for their own failure below) -------------------------------------------


def leak_violations(seen: dict[str, set[str]], scope_of: dict[str, ScopeKey],
                    admitted_by_scope: dict[ScopeKey, set[str]]) -> list[str]:
    """Every record id a client saw must have been admitted in its own scope, and in no other."""
    out = []
    for client, ids in sorted(seen.items()):
        own = scope_of[client]
        for rid in sorted(ids - admitted_by_scope.get(own, set())):
            where = [s for s, admitted in admitted_by_scope.items() if rid in admitted]
            out.append(f"{client} ({own}) saw {rid}, admitted in {where or 'no scope'}")
    return out


def census_violations(scope: ScopeKey, admitted: set[str], forgotten: set[str], searched: set[str],
                      got: set[str]) -> list[str]:
    """What a scope holds at the end: exactly its admitted records minus the forgotten ones."""
    expected = admitted - forgotten
    out = []
    if searched != expected:
        out.append(f"{scope}: search found {len(searched)}, expected {len(expected)}: "
                   f"missing {sorted(expected - searched)[:5]}, extra {sorted(searched - expected)[:5]}")
    if got != expected:
        out.append(f"{scope}: get found {len(got)}, expected {len(expected)}: "
                   f"missing {sorted(expected - got)[:5]}, extra {sorted(got - expected)[:5]}")
    return out


def test_checkers_catch_violations() -> None:
    a, b = ("t-a", "ws-1"), ("t-b", "ws-1")
    admitted = {a: {"mem_a1", "mem_a2"}, b: {"mem_b1"}}
    scope_of = {"x": a, "y": b}
    assert leak_violations({"x": {"mem_a1"}, "y": {"mem_b1"}}, scope_of, admitted) == []
    leaks = leak_violations({"x": {"mem_a1", "mem_b1"}, "y": set()}, scope_of, admitted)
    assert leaks == [f"x ({a}) saw mem_b1, admitted in {[b]}"]
    assert census_violations(a, {"r1", "r2"}, {"r2"}, {"r1"}, {"r1"}) == []
    assert len(census_violations(a, {"r1", "r2"}, {"r2"}, {"r1", "r2"}, {"r1"})) == 1  # a forgotten record found
    assert len(census_violations(a, {"r1", "r2"}, set(), {"r1"}, set())) == 2  # records lost


# ---- the load -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> HostKit:
    kit = HostKit(tmp_path_factory.mktemp("iso-keys"))
    kit.add("host-a")
    kit.add("host-b")
    kit.add("auditor")
    return kit


@pytest.fixture(scope="module")
def server(kit: HostKit, tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str]) -> Iterator[HttpServer]:
    data_dir: Path = tmp_path_factory.mktemp("iso-data")
    with http_server(data_dir, kit, offline_env, extra=["--rate-limit", "0"]) as srv:
        yield srv


def hits(envelope: dict[str, Any]) -> list[str]:
    assert envelope["ok"], envelope
    return [p["record"]["record_id"] for p in envelope["output"]["value"]["records"]]


def code(envelope: dict[str, Any]) -> str:
    return "ok" if envelope["ok"] else str(envelope["error"]["code"])


async def capture(c: SignedClient, p: Probe) -> str:
    text = (f"{p.marker} decision number {p.serial + 1} for tenant {p.tenant} workspace {p.workspace}: "
            f"the team keeps entry {p.serial + 1} of principal {p.principal} on record.")
    args = capture_args(text, key=p.next("cap"))
    env = await c.call("capture", args)
    assert env["ok"] and env["output"]["value"]["status"] == "committed_pending", env
    cid = env["output"]["value"]["candidate_id"]
    p.captures.append((args, cid))
    p.pending.append(cid)
    p.counts["capture"] += 1
    return cid


async def admit(c: SignedClient, p: Probe, cid: str) -> None:
    args = {"candidate_id": cid, "idempotency_key": p.next("adm")}
    env = await c.call("request_admission", args)
    assert env["ok"], env
    value = env["output"]["value"]
    assert value["replayed"] is False and value["outcome"]["status"] == "accepted", value
    p.pending.remove(cid)
    p.admissions.append((args, value["outcome"]))
    p.admitted.append(value["outcome"]["record_id"])
    p.counts["admit"] += 1


async def double_capture(c: SignedClient, p: Probe) -> None:
    """The same capture sent twice at once: one candidate, one committed and one duplicate answer."""
    text = f"{p.marker} concurrent retry {p.serial + 1} of principal {p.principal} lands exactly once."
    args = capture_args(text, key=p.next("dup"))
    answers: list[dict[str, Any]] = []

    async def send() -> None:
        answers.append(await c.call("capture", args))

    async with anyio.create_task_group() as tg:
        tg.start_soon(send)
        tg.start_soon(send)
    values = [a["output"]["value"] for a in answers if a["ok"]]
    assert len(values) == 2, answers
    assert values[0]["candidate_id"] == values[1]["candidate_id"], values
    assert sorted(v["status"] for v in values) == ["committed_pending", "duplicate_exact"], values
    p.captures.append((args, values[0]["candidate_id"]))
    p.pending.append(values[0]["candidate_id"])
    p.counts["retry_capture"] += 1


async def retry_capture(c: SignedClient, p: Probe, rng: random.Random) -> None:
    args, cid = rng.choice(p.captures)
    env = await c.call("capture", args)
    assert env["ok"], env
    assert env["output"]["value"]["candidate_id"] == cid and env["output"]["value"]["status"] == "duplicate_exact"
    p.counts["retry_capture"] += 1


async def retry_admission(c: SignedClient, p: Probe, rng: random.Random) -> None:
    args, outcome = rng.choice(p.admissions)
    env = await c.call("request_admission", args)  # same key, same arguments: the first answer, replayed
    assert env["ok"], env
    value = env["output"]["value"]
    assert value["replayed"] is True and value["outcome"] == outcome, (value, outcome)
    p.counts["retry_admission"] += 1
    if outcome["record_id"] not in p.forgotten:  # another key for a decided candidate: the same record
        env = await c.call("request_admission", {"candidate_id": args["candidate_id"],
                                                 "idempotency_key": p.next("adm2")})
        value = env["output"]["value"]
        assert value["replayed"] is False and value["outcome"]["status"] == "duplicate_exact", value
        assert value["outcome"]["record_id"] == outcome["record_id"], value
        p.counts["readmit_new_key"] += 1


async def forget(c: SignedClient, p: Probe, rng: random.Random) -> None:
    live = [r for r in p.admitted if r not in p.forgotten]
    if len(live) < 2:
        return
    rid = rng.choice(live)
    args = {"record_id": rid, "idempotency_key": p.next("fg"), "reason_ref": "reason:isolation-test"}
    first = await c.call("forget", args)
    assert first["ok"] and first["output"]["value"]["replayed"] is False, first
    p.forgotten.add(rid)
    again = await c.call("forget", args)  # a retry with the same key: the first answer, replayed
    assert again["ok"] and again["output"]["value"]["replayed"] is True, again
    assert again["output"]["value"]["receipt"] == first["output"]["value"]["receipt"]
    assert code(await c.call("get", get_args(rid))) == "NOT_FOUND"
    p.counts["forget"] += 1


async def search_marker(c: SignedClient, p: Probe, marker: str, same_scope: bool) -> tuple[list[str], bool]:
    """The record ids of one page for ``marker``, and whether more pages follow."""
    env = await c.call("search", search_args(marker, limit=PAGE_LIMIT, max_packet_bytes=PACKET_BYTES))
    found = hits(env)
    p.seen.update(found)
    if not same_scope:
        assert found == [], f"{p.name} searched another scope's marker {marker} and found {found}"
    return found, bool(env["output"]["value"].get("next_page_cursor"))


async def drive(url: str, kit: HostKit, p: Probe, probes: list[Probe], seconds: float, seed: int) -> None:
    rng = random.Random(seed)
    host = host_context(tenant=p.tenant, workspace=p.workspace, principal=p.principal, agent_id=f"agent-{p.name}",
                        session=f"sess-{p.name}")
    others = [o for o in probes if o is not p]
    mates = [o for o in others if o.scope == p.scope]
    strangers = [o for o in others if o.scope != p.scope]
    ops = ("capture", "admit", "double", "search_own", "search_mate", "search_stranger", "get_own",
           "get_stranger", "get_mate", "forget", "retry_capture", "retry_admission")
    weights = (14, 10, 3, 14, 5, 8, 10, 10, 4, 5, 8, 8)
    async with signed_client(url, kit, p.kid, host) as c:
        await c.list_names()  # a signed tools/list fills the SDK's output-schema cache: every result is validated
        for _ in range(3):  # something to search, get and forget from the start
            await admit(c, p, await capture(c, p))
        deadline = anyio.current_time() + seconds
        while anyio.current_time() < deadline:
            op = rng.choices(ops, weights)[0]
            live = [r for r in p.admitted if r not in p.forgotten]
            if op == "capture":
                cid = await capture(c, p)
                if rng.random() < 0.7:
                    await admit(c, p, cid)
            elif op == "admit" and p.pending:
                await admit(c, p, rng.choice(p.pending))
            elif op == "double":
                await double_capture(c, p)
            elif op == "search_own":
                found, more = await search_marker(c, p, p.marker, True)
                if not more:  # one page holds them all: every live record is found
                    assert set(live) <= set(found), (p.name, sorted(set(live) - set(found)))
                p.counts["search"] += 1
            elif op == "search_mate" and mates:
                await search_marker(c, p, rng.choice(mates).marker, True)
                p.counts["search"] += 1
            elif op == "search_stranger":
                await search_marker(c, p, rng.choice(strangers).marker, False)
                p.counts["search"] += 1
            elif op == "get_own" and live:
                rid = rng.choice(live)
                env = await c.call("get", get_args(rid))  # only this client forgets its records
                assert env["ok"] and env["output"]["value"]["record"]["record_id"] == rid, env
                p.seen.add(rid)
                p.counts["get"] += 1
            elif op == "get_stranger":
                pool = [r for o in strangers for r in o.admitted]
                if pool:
                    rid = rng.choice(pool)
                    env = await c.call("get", get_args(rid))
                    assert code(env) == "NOT_FOUND", (p.name, rid, env)
                    p.counts["get_foreign"] += 1
            elif op == "get_mate" and mates:
                pool = [r for o in mates for r in o.admitted]
                if pool:
                    env = await c.call("get", get_args(rng.choice(pool)))
                    assert code(env) in ("ok", "NOT_FOUND"), env  # NOT_FOUND only once the mate forgot it
                    if env["ok"]:
                        p.seen.add(env["output"]["value"]["record"]["record_id"])
                    p.counts["get"] += 1
            elif op == "forget":
                await forget(c, p, rng)
            elif op == "retry_capture" and p.captures:
                await retry_capture(c, p, rng)
            elif op == "retry_admission" and p.admissions:
                await retry_admission(c, p, rng)
        # Every kind at least once, whatever the dice said.
        await forget(c, p, rng)
        await retry_capture(c, p, rng)
        await retry_admission(c, p, rng)
        for mate in mates:
            await search_marker(c, p, mate.marker, True)


async def census(url: str, kit: HostKit, scope: ScopeKey, markers: list[str], admitted: set[str],
                 foreign_markers: list[str]) -> tuple[set[str], set[str]]:
    """A fresh principal's view of one scope: every marker searched (paged), every admitted id got."""
    host = host_context(tenant=scope[0], workspace=scope[1], principal="p-auditor", agent_id="agent-auditor",
                        session="sess-census")
    searched: set[str] = set()
    got: set[str] = set()
    async with signed_client(url, kit, "auditor", host) as c:
        await c.list_names()
        for marker in markers:
            cursor: str | None = None
            while True:
                extra: dict[str, Any] = {"limit": PAGE_LIMIT, "max_packet_bytes": PACKET_BYTES}
                if cursor is not None:
                    extra["page_cursor"] = cursor
                env = await c.call("search", search_args(marker, **extra))
                searched.update(hits(env))
                cursor = env["output"]["value"].get("next_page_cursor")
                if not cursor:
                    break
        for marker in foreign_markers:
            assert hits(await c.call("search", search_args(marker, limit=PAGE_LIMIT))) == [], (scope, marker)
        for rid in sorted(admitted):
            env = await c.call("get", get_args(rid))
            assert code(env) in ("ok", "NOT_FOUND"), env
            if env["ok"]:
                got.add(rid)
    return searched, got


async def test_isolation_under_load(server: HttpServer, kit: HostKit) -> None:
    probes = [Probe(*row) for row in CLIENTS]
    async with anyio.create_task_group() as tg:
        for i, p in enumerate(probes):
            tg.start_soon(drive, server.url, kit, p, probes, LOAD_SECONDS, 1000 + i)

    scopes = sorted({p.scope for p in probes})
    admitted_by_scope = {s: {r for p in probes if p.scope == s for r in p.admitted} for s in scopes}
    forgotten_by_scope = {s: {r for p in probes if p.scope == s for r in p.forgotten} for s in scopes}
    counts = sum((p.counts for p in probes), Counter[str]())

    # Nothing vacuous: every client admitted, forgot and retried; mates saw each other's records.
    for p in probes:
        assert len(p.admitted) >= 3 and p.forgotten and p.counts["retry_capture"] and p.counts["retry_admission"], \
            (p.name, p.counts)
    for p in probes:
        for mate in (o for o in probes if o.scope == p.scope and o is not p):
            assert p.seen & (set(mate.admitted) - mate.forgotten), f"{p.name} never saw a record of {mate.name}"
    assert counts["get_foreign"] > 0 and counts["search"] > 0
    all_ids = [r for p in probes for r in p.admitted]
    assert len(all_ids) == len(set(all_ids)), "a record id was admitted twice"

    assert leak_violations({p.name: p.seen for p in probes}, {p.name: p.scope for p in probes},
                           admitted_by_scope) == []

    problems: list[str] = []
    for s in scopes:
        markers = [p.marker for p in probes if p.scope == s]
        foreign = [p.marker for p in probes if p.scope != s]
        searched, got = await census(server.url, kit, s, markers, admitted_by_scope[s], foreign)
        problems += census_violations(s, admitted_by_scope[s], forgotten_by_scope[s], searched, got)
    assert problems == []
    assert "Traceback" not in server.stderr()
