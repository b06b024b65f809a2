"""`engram-memory admin dispute|resolve|supersede|revoke-trust|rewind` through the real CLI.

On a closed data dir (the command opens the store), through a running stdio owner and a running
`serve --http` (the owner's local socket route applies it in process: the server's next search
reflects it), and on a PostgreSQL store (an admin node; the serving node follows the journal).
The agent's side goes through real server processes and the MCP SDK client, or the engine's
typed API where a store is only being filled.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from engram_memory.models.settings import EngineSettings
from engram_memory.store.core.engine import Engine
from engram_memory.store.maintenance.rebuild import rebuild_index
from tests.conftest import (
    CONTEXT,
    Backend,
    Human,
    Mcp,
    get_args,
    key,
    mcp_server,
    search_args,
    serve_argv,
    sha,
    store_backend,
)
from tests.conftest import capture_args as wire_capture
from tests.http_fixtures import HostKit, host_context, http_server, signed_client
from tests.store_fixtures import PURPOSE, T0, call, capture_args, ctx
from tests.test_admin_cli import ALL_TOOLS, admin, ok_json, refused

REASON = "checked against the signed contract"
HOST_OPS = ("dispute", "resolve", "supersede", "revoke-trust", "rewind")


def open_engine(data_dir: Path) -> Engine:
    return Engine.open(EngineSettings(data_dir=data_dir, semantic=False), clock=lambda: T0)


def admit_all(engine: Engine, texts: list[str], principal: str = "alice") -> list[str]:
    c, out = ctx(principal=principal), []
    for i, text in enumerate(texts):
        cap = call(engine, "capture", c, capture_args(text, key=f"capture-{principal}-{i:06d}"))
        adm = call(engine, "request_admission", c,
                   {"candidate_id": cap["candidate_id"], "idempotency_key": f"admit-{principal}-{i:06d}"})
        out.append(adm["outcome"]["record_id"])
    return out


def found(data_dir: Path, word: str) -> list[str]:
    engine = open_engine(data_dir)
    try:
        value = call(engine, "search", ctx(), {"query": word, "purpose_ref": PURPOSE})
        return sorted(p["record"]["record_id"] for p in value["records"])
    finally:
        engine.close()


def verified(where: list[str]) -> None:
    report = ok_json(["verify", *where])
    assert report["ok"] is True and report["problems"] == [], report


# ---- a closed data dir ----------------------------------------------------------------------------


def test_each_command_on_a_closed_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    engine = open_engine(data)
    try:
        a, b, c, d = admit_all(engine, ["amber one", "amber two", "amber three", "amber four"])
        (m,) = admit_all(engine, ["amber mallory"], principal="mallory")
    finally:
        engine.close()
    where = ["--data-dir", str(data)]
    cursor = ok_json(["history", "--scope", "acme/main", *where])["events"][-1]["cursor"]

    out = ok_json(["dispute", "--record", a, "--reason", REASON, *where])
    assert (out["operation"], out["from_state"], out["to_state"], out["record_ids"]) == (
        "dispute", "accepted_current", "accepted_disputed", [a])
    assert out["online"] is False and out["scope"] == "acme/main" and out["operation_digest"].startswith("sha256:")
    assert out["receipt"]["event_digest"] == out["event_hash"] and out["reason"] == REASON
    assert a not in found(data, "amber")
    verified(where)

    out = ok_json(["resolve", "--record", a, "--current", "--reason", REASON, *where])
    assert (out["operation"], out["to_state"]) == ("resolve_dispute", "accepted_current")
    assert a in found(data, "amber")
    verified(where)

    out = ok_json(["supersede", "--record", b, "--by", c, "--reason", REASON, *where])
    assert (out["to_state"], out["related_record_id"]) == ("historical", c)
    assert b not in found(data, "amber")
    verified(where)

    out = ok_json(["rewind", "--record", b, "--to-cursor", str(cursor), "--reason", REASON, *where])
    assert (out["operation"], out["to_state"], out["related_record_id"]) == ("rewind", "accepted_current", c)
    assert found(data, "amber") == sorted([a, b, d, m])
    verified(where)

    out = ok_json(["revoke-trust", "--scope", "acme/main", "--principal", "mallory", "--reason", REASON, *where])
    assert (out["to_state"], out["record_ids"], out["receipt"]["count"]) == ("trust_invalid", [m], 1)
    assert found(data, "amber") == sorted([a, b, d])
    verified(where)

    # A table without --json: the fields, one per line.
    proc = admin(["dispute", "--record", d, "--reason", REASON, *where])
    assert proc.returncode == 0, proc.stderr
    assert "accepted_disputed" in proc.stdout and d in proc.stdout and "operation_digest" in proc.stdout
    proc = admin(["resolve", "--record", d, "--historical", "--reason", REASON, *where])
    assert proc.returncode == 0 and "historical" in proc.stdout, proc.stderr
    history = ok_json(["history", "--scope", "acme/main", *where])["events"]
    assert [e["operation"] for e in history[-7:]] == ["dispute", "resolve_dispute", "supersede", "rewind",
                                                        "trust_invalidate", "dispute", "mark_non_current"]
    assert all(e["reason"] == REASON for e in history[-7:])

    # A rebuilt index answers the same searches.
    before = {w: found(data, w) for w in ("amber", "one", "two", "three", "four", "mallory")}
    rebuild_index(data, show_progress=False, semantic=False)
    assert {w: found(data, w) for w in before} == before and before["amber"] == sorted([a, b])


def test_supersede_by_family(tmp_path: Path) -> None:
    data, family = tmp_path / "data", "family:deploy-target"
    engine = Engine.open(EngineSettings(data_dir=data, semantic=False, consented_families=(family,)),
                         clock=lambda: T0)
    try:
        c, ids = ctx(), []
        for i, text in enumerate(["dune deploys to eu", "dune deploys to us", "dune deploys to asia"]):
            args = capture_args(text, key=f"family-capture-{i:04d}", reconciliation={"family_refs": [family]})
            cap = call(engine, "capture", c, args)
            adm = call(engine, "request_admission", c,
                       {"candidate_id": cap["candidate_id"], "idempotency_key": f"family-admit-{i:06d}"})
            ids.append(adm["outcome"]["record_id"])
        (other,) = admit_all(engine, ["dune unrelated"])
    finally:
        engine.close()
    where = ["--data-dir", str(data)]
    out = ok_json(["supersede", "--by", ids[2], "--family", family, "--reason", REASON, *where])
    assert (out["record_ids"], out["related_record_id"], out["family_ref"]) == (sorted(ids[:2]), ids[2], family)
    assert found(data, "dune") == sorted([ids[2], other])
    refused(admin(["supersede", "--by", other, "--family", family, "--reason", REASON, *where]), 2, "record ")
    refused(admin(["supersede", "--by", ids[2], "--family", family, "--reason", REASON, *where]), 1,
            "NOTHING_MATCHES: ")
    verified(where)


def test_mistakes_and_refusals_are_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    engine = open_engine(data)
    try:
        a, b = admit_all(engine, ["basalt one", "basalt two"])
    finally:
        engine.close()
    where = ["--data-dir", str(data)]
    head = ok_json(["history", "--scope", "acme/main", *where])["events"][-1]
    usage = [
        ["resolve", "--record", a, "--reason", REASON],  # neither --current nor --historical
        ["dispute", "--record", "mem_" + "a" * 52, "--reason", REASON],
        ["dispute", "--record", a, "--reason", "  "],
        ["dispute", "--record", a, "--reason", "the new password is Hunter2Hunter2!"],
        ["supersede", "--by", b, "--reason", REASON],  # neither --record nor --family
        ["supersede", "--record", a, "--family", "family:x", "--by", b, "--reason", REASON],
        ["supersede", "--record", a, "--by", a, "--reason", REASON],
        ["revoke-trust", "--scope", "acme/main", "--reason", REASON],
        ["revoke-trust", "--scope", "acme/main", "--principal", "p", "--source-ref", "s", "--reason", REASON],
        ["revoke-trust", "--scope", "nope", "--principal", "p", "--reason", REASON],
        ["revoke-trust", "--scope", "acme/other", "--principal", "alice", "--reason", REASON],
        ["rewind", "--record", a, "--to-cursor", "999", "--reason", REASON],
        ["dispute", "--record", a, "--reason", REASON, "--master-key-file", str(tmp_path / "k")],
    ]
    for args in usage:
        refused(admin([*args, *where]), 2, "")
    refusals = [
        ["resolve", "--record", a, "--current", "--reason", REASON],
        ["rewind", "--record", a, "--to-cursor", "1", "--reason", REASON],
        ["revoke-trust", "--scope", "acme/main", "--principal", "nobody", "--reason", REASON],
    ]
    for args in refusals:
        proc = admin([*args, *where])
        refused(proc, 1, "ILLEGAL_TRANSITION: " if args[0] != "revoke-trust" else "NOTHING_MATCHES: ")
    assert ok_json(["history", "--scope", "acme/main", *where])["events"][-1] == head  # nothing journalled
    verified(where)


# ---- through a running server ---------------------------------------------------------------------


async def capture_and_admit(mcp: Mcp, text: str) -> str:
    cap = await mcp.call("capture", wire_capture(text, key=key("cap")))
    assert cap["ok"], cap
    adm = await mcp.call("request_admission", {"candidate_id": cap["output"]["value"]["candidate_id"],
                                                "idempotency_key": key("adm")})
    assert adm["output"]["value"]["outcome"]["status"] == "accepted", adm
    return str(adm["output"]["value"]["outcome"]["record_id"])


async def hybrid_ids(mcp: Mcp, word: str) -> list[str]:
    """The ids a lexical-and-semantic search returns (once the model is ready: both channels ran)."""
    policy = {"minimum_channels": "lexical_and_semantic", "network": "forbid"}
    for _ in range(240):
        out = await mcp.call("search", search_args(word, capability_policy=policy))
        if out["ok"]:
            value = out["output"]["value"]
            ids = sorted(p["record"]["record_id"] for p in value["records"])
            # Every record found is ranked by the vector index too (a record back to current is in it again).
            assert ids == sorted(e["record_id"] for e in value["rank_receipt"]["ranked"] if "semantic" in e), value
            return ids
        assert out["error"]["code"] == "RANKING_UNAVAILABLE", out
        await anyio.sleep(0.5)
    raise AssertionError("the embedding model never became ready")


def test_a_stdio_owner_applies_each_command_and_forget_works_from_each_state(tmp_path: Path,
                                                                              offline_env: dict[str, str]) -> None:
    """The real stdio server with its embedding model: each command goes through its socket, its
    next search (both channels) and get follow, and the agent's forget works from every new state."""
    data = tmp_path / "data"
    where = ["--data-dir", str(data)]

    async def main() -> str:
        async with mcp_server(serve_argv(data), offline_env, human=Human(), log_dir=tmp_path) as mcp:
            names = {t.name for t in (await mcp.session.list_tools()).tools}
            assert names == ALL_TOOLS  # still exactly the six
            texts = ["cobalt disputed", "cobalt old", "cobalt new", "cobalt leaked"]
            disputed, old, new, leaked = [await capture_and_admit(mcp, t) for t in texts]
            assert await hybrid_ids(mcp, "cobalt") == sorted([disputed, old, new, leaked])

            async def run(*args: str) -> dict[str, Any]:
                out = await anyio.to_thread.run_sync(ok_json, [*args, "--reason", REASON, *where], offline_env)
                assert out["online"] is True, out
                return dict(out)

            await run("dispute", "--record", disputed)
            assert await hybrid_ids(mcp, "cobalt") == sorted([old, new, leaked])
            got = await mcp.call("get", get_args(disputed))
            assert not got["ok"] and got["error"]["code"] == "NOT_FOUND"
            await run("resolve", "--record", disputed, "--current")  # back: its stored vector too
            assert await hybrid_ids(mcp, "cobalt") == sorted([disputed, old, new, leaked])
            assert (await mcp.call("get", get_args(disputed)))["ok"]
            await run("dispute", "--record", disputed)
            await run("supersede", "--record", old, "--by", new)
            await run("revoke-trust", "--scope", f"{CONTEXT['tenant']}/{CONTEXT['workspace']}",
                      "--evidence-ref", sha("evidence:cobalt leaked"))
            assert await hybrid_ids(mcp, "cobalt") == [new]
            # A refusal and a mistake through the socket: one line each, nothing changed.
            proc = await anyio.to_thread.run_sync(admin, ["dispute", "--record", old, "--reason", REASON, *where],
                                                  offline_env)
            refused(proc, 1, "ILLEGAL_TRANSITION: ")
            proc = await anyio.to_thread.run_sync(admin, ["dispute", "--record", "mem_" + "b" * 52, "--reason",
                                                          REASON, *where], offline_env)
            refused(proc, 2, "no record ")
            # The route wants the owner's token, as the backup route does.
            import httpx2

            with httpx2.Client(transport=httpx2.HTTPTransport(uds=str(data / "engram.sock"))) as client:
                assert client.post("http://localhost/admin/hostop",
                                   json={"operation": "dispute", "record_id": new, "reason": REASON}).status_code == 401
            for rid, state in ((disputed, "accepted_disputed"), (old, "historical"), (leaked, "trust_invalid")):
                out = await mcp.call("forget", {"record_id": rid, "idempotency_key": key("forget"),
                                                "reason_ref": "reason:user-request"})
                assert out["ok"], out
                receipt = out["output"]["value"]["receipt"]
                assert (receipt["from_state"], receipt["to_state"]) == (state, "tombstoned")
            assert await hybrid_ids(mcp, "cobalt") == [new]
            for name in ("engram_memory_dispute", "engram_memory_supersede", "engram_memory_revoke_trust",
                         "engram_memory_rewind", "engram_memory_resolve", "admin_dispute"):
                with pytest.raises(MCPError) as info:
                    await mcp.session.call_tool(name, {"record_id": new})
                assert (info.value.code, info.value.message) == (-32602, "Unknown tool"), name
            return new

    new = anyio.run(main)
    verified(where)
    # With the server gone, the commands open the store (without the model): a record back to
    # current gets its stored vector indexed again, so the projections still equal a rebuild.
    for args in (["dispute", "--record", new], ["resolve", "--record", new, "--current"]):
        assert ok_json([*args, "--reason", REASON, *where])["online"] is False
    verified(where)


def test_serve_http_applies_a_command_through_its_local_route(tmp_path: Path, offline_env: dict[str, str]) -> None:
    kit = HostKit(tmp_path / "keys")
    kit.add("host-a")
    data = tmp_path / "data"
    host = host_context()

    async def main(url: str) -> None:
        async with signed_client(url, kit, "host-a", host) as client:
            ids = []
            for text in ("dune before", "dune after"):
                cap = await client.call("capture", wire_capture(text, key=key("cap")))
                adm = await client.call("request_admission", {"candidate_id": cap["output"]["value"]["candidate_id"],
                                                              "idempotency_key": key("adm")})
                ids.append(adm["output"]["value"]["outcome"]["record_id"])

            async def search() -> list[str]:
                out = await client.call("search", search_args("dune"))
                return sorted(p["record"]["record_id"] for p in out["output"]["value"]["records"])

            assert await search() == sorted(ids)
            out = await anyio.to_thread.run_sync(ok_json, ["supersede", "--record", ids[0], "--by", ids[1], "--reason",
                                                           REASON, "--data-dir", str(data)], offline_env)
            assert out["online"] is True and out["to_state"] == "historical"
            assert await search() == [ids[1]]

    with http_server(data, kit, offline_env) as server:
        anyio.run(main, server.url)
    verified(["--data-dir", str(data)])


# ---- PostgreSQL --------------------------------------------------------------------------------------


@pytest.fixture
def pg_backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    """A PostgreSQL store made by the real ``admin init-store`` (the DuckDB store is covered above)."""
    with store_backend("postgres", request, tmp_path_factory.mktemp("store-key")) as chosen:
        yield chosen


def test_commands_on_a_postgresql_store(pg_backend: Backend, tmp_path: Path) -> None:
    backend = pg_backend
    assert backend.store is not None and backend.master_key_file is not None
    engine = Engine.open(EngineSettings(data_dir=tmp_path / "node", semantic=False, store=backend.store,
                                        master_key_file=backend.master_key_file), clock=lambda: T0)
    where = ["--store", backend.store, "--master-key-file", str(backend.master_key_file)]
    try:
        a, b, c = admit_all(engine, ["fjord one", "fjord two", "fjord three"])
        cursor = engine.db.high_water(ctx().scope_ref)

        def ids() -> list[str]:
            value = call(engine, "search", ctx(), {"query": "fjord", "purpose_ref": PURPOSE})
            return sorted(p["record"]["record_id"] for p in value["records"])

        assert ok_json(["dispute", "--record", a, "--reason", REASON, *where])["to_state"] == "accepted_disputed"
        assert ids() == sorted([b, c])  # the serving node followed the journal
        assert ok_json(["supersede", "--record", b, "--by", c, "--reason", REASON, *where])["to_state"] == "historical"
        assert ids() == [c]
        assert ok_json(["rewind", "--record", b, "--to-cursor", str(cursor), "--reason", REASON, *where])[
            "related_to_state"] == "historical"
        assert ids() == [b]
        out = ok_json(["revoke-trust", "--scope", "acme/main", "--source-ref", "doc:adr-7", "--reason", REASON, *where])
        assert out["record_ids"] == [b] and ids() == []
        out = ok_json(["resolve", "--record", a, "--current", "--reason", REASON, *where])
        assert out["online"] is False and ids() == [a]
        refused(admin(["dispute", "--record", c, "--reason", REASON, *where]), 1, "ILLEGAL_TRANSITION: ")
        refused(admin(["revoke-trust", "--scope", "acme/none", "--principal", "x", "--reason", REASON, *where]), 2,
                "no scope ")
    finally:
        engine.close()
    verified(where)
