"""Operator approvals for a client without elicitation (issue 37), end to end.

A real ``engram-memory serve`` over stdio, driven by the MCP SDK's client WITHOUT the elicitation
capability; the operator decides through the real ``engram-memory admin approvals|approve|deny``
(through the owner's socket on DuckDB, as an admin node on PostgreSQL). Both store backends.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import CONTEXT, Backend, get_args, key, search_args
from tests.test_admin_cli import admin, ok_json, refused
from tests.test_e2e_stdio import LEXICAL_ONLY, capture_and_admit, record_ids

pytestmark = pytest.mark.anyio

SCOPE = f"{CONTEXT['tenant']}/{CONTEXT['workspace']}"
REASON = "the user asked the agent to forget it"


def where(backend: Backend, data_dir: Path) -> list[str]:
    """Where the admin commands find the store the server uses."""
    return backend.args() if backend.store is not None else ["--data-dir", str(data_dir)]


async def run_ok(args: list[str], env: dict[str, str]) -> Any:
    return await anyio.to_thread.run_sync(ok_json, args, env)


async def run(args: list[str], env: dict[str, str]) -> Any:
    return await anyio.to_thread.run_sync(admin, args, env)


def forget_args(record_id: str) -> dict[str, Any]:
    return {"record_id": record_id, "idempotency_key": key("forget"), "reason_ref": "reason:user-request"}


async def pending(loc: list[str], env: dict[str, str], *scope: str) -> list[dict[str, Any]]:
    return list((await run_ok(["approvals", *scope, *loc], env))["requests"])


async def test_forget_approved_denied_and_expired_by_the_operator(start_server, data_dir_factory, backend,
                                                                  offline_env) -> None:
    data_dir = data_dir_factory("approvals")
    loc = where(backend, data_dir)
    async with start_server(data_dir, human=None, extra=LEXICAL_ONLY, backend=backend) as mcp:
        assert "approve" in (mcp.init.instructions or "") and "same idempotency_key" in (mcp.init.instructions or "")
        _, kept = await capture_and_admit(mcp, "Lanterns keep the harbour lit at night.")
        _, gone = await capture_and_admit(mcp, "Lanterns of the old pier are decommissioned.")
        assert sorted(record_ids(await mcp.call("search", search_args("lanterns")))) == sorted([kept, gone])

        # 1. refused: gate_failed, parked for the operator; the retry before a decision is refused too.
        args = forget_args(gone)
        first = await mcp.call("forget", args)
        assert first["error"]["code"] == "gate_failed" and first["error"]["retriable"] is False
        assert (await mcp.call("forget", args))["error"]["code"] == "gate_failed"
        [request] = await pending(loc, offline_env)
        assert request["target"] == gone and request["capability"] == "engram_memory_forget"
        assert (request["agent_id"], request["principal"], request["scope"]) == (
            CONTEXT["agent_id"], CONTEXT["principal"], SCOPE)
        assert request["operation_digest"].startswith("sha256:") and request["age_s"] >= 0
        # Another scope's listing never shows it.
        assert await pending(loc, offline_env, "--scope", "other-tenant/other-ws") == []
        assert [r["request_id"] for r in await pending(loc, offline_env, "--scope", SCOPE)] == [request["request_id"]]

        # 2. approved: executed at once; the same call retried answers the tombstone, replayed.
        decided = await run_ok(["approve", "--request", request["request_id"], "--reason", REASON, *loc],
                               offline_env)
        assert (decided["status"], decided["outcome"]) == ("approved", "ok")
        retried = await mcp.call("forget", args)
        assert retried["ok"], retried
        value = retried["output"]["value"]
        assert value["replayed"] is True and value["receipt"]["to_state"] == "tombstoned"
        assert record_ids(await mcp.call("search", search_args("lanterns"))) == [kept]
        assert (await mcp.call("get", get_args(gone)))["error"]["code"] == "NOT_FOUND"
        assert await pending(loc, offline_env) == []
        # Decided once: a second decision is one line, exit 1.
        refused(await run(["deny", "--request", request["request_id"], "--reason", REASON, *loc], offline_env),
                1, "NOT_PENDING: ")
        refused(await run(["approve", "--request", "apr_" + "a" * 26, "--reason", REASON, *loc], offline_env),
                1, "UNKNOWN_REQUEST: ")
        # A reason carrying a secret is refused before the store is touched.
        refused(await run(["approve", "--request", "apr_" + "a" * 26, "--reason",
                           "password=Tr0ub4dor&3xyzzy-Q", *loc], offline_env), 2, "--reason looks like")

        # 3. denied: the retry is gate_failed, for good; the record stays.
        args = forget_args(kept)
        assert (await mcp.call("forget", args))["error"]["code"] == "gate_failed"
        [request] = await pending(loc, offline_env)
        decided = await run_ok(["deny", "--request", request["request_id"], "--reason", "keep it", *loc],
                               offline_env)
        assert decided["status"] == "denied" and "outcome" not in decided
        assert (await mcp.call("forget", args))["error"]["code"] == "gate_failed"
        assert record_ids(await mcp.call("search", search_args("lanterns"))) == [kept]
        refused(await run(["approve", "--request", request["request_id"], "--reason", REASON, *loc], offline_env),
                1, "NOT_PENDING: ")
    # The store still verifies: every data key a row references exists, the destroyed ones are gone.
    report = await run_ok(["verify", *loc], offline_env)
    assert report["ok"] is True and report["problems"] == [], report


async def test_an_undecided_request_expires(start_server, data_dir_factory, backend, offline_env) -> None:
    """Not decided within the TTL (300 s): expired. The operator's commands run on the fixed clock the
    tests use (ENGRAM_CLOCK_MS) 301 s later, instead of a 300 s wait; the server is stopped meanwhile
    so that, on DuckDB, the command opens the store itself (its own clock)."""
    data_dir = data_dir_factory("expiry")
    loc = where(backend, data_dir)
    async with start_server(data_dir, human=None, extra=LEXICAL_ONLY, backend=backend) as mcp:
        _, record_id = await capture_and_admit(mcp, "Tide tables are printed every spring.")
        args = forget_args(record_id)
        assert (await mcp.call("forget", args))["error"]["code"] == "gate_failed"
        [request] = await pending(loc, offline_env)
        assert 0 < request["expires_in_s"] <= 300
    later = {**offline_env, "ENGRAM_CLOCK_MS": str(int(time.time() * 1000) + 301_000)}
    refused(await run(["approve", "--request", request["request_id"], "--reason", REASON, *loc], later),
            1, "NOT_PENDING: ")
    assert await pending(loc, later) == []
    async with start_server(data_dir, human=None, extra=LEXICAL_ONLY, backend=backend) as mcp:
        assert (await mcp.call("forget", args))["error"]["code"] == "gate_failed"
        assert (await mcp.call("get", get_args(record_id)))["ok"]


async def test_the_host_may_turn_the_queue_off(start_server, data_dir_factory, offline_env) -> None:
    data_dir = data_dir_factory("queue-off")
    async with start_server(data_dir, human=None, extra=[*LEXICAL_ONLY, "--confirm-fallback", "off"]) as mcp:
        _, record_id = await capture_and_admit(mcp, "Ferries leave on the hour.")
        err = await mcp.call_error("forget", forget_args(record_id))
        assert (err.code, err.message) == (-32603, "Trusted invocation context unavailable")
        assert await pending(["--data-dir", str(data_dir)], offline_env) == []


async def test_a_relayed_launch_without_elicitation_is_queued_at_the_owner(start_server, data_dir_factory,
                                                                         offline_env) -> None:
    """A second launch on the data dir relays to the owner: its client's forget is parked there, bound
    to the relaying host's context, and one scope's request never shows under another scope."""
    from tests.test_local_hosts import A, C

    data_dir = data_dir_factory("relay") / "data"
    loc = ["--data-dir", str(data_dir)]
    async with start_server(data_dir, context=A, human=None, extra=LEXICAL_ONLY) as owner, \
            start_server(data_dir, context=C, human=None, extra=LEXICAL_ONLY) as relay:
        _, mine = await capture_and_admit(relay, "Relayed hosts keep their own scope.")
        args = forget_args(mine)
        assert (await relay.call("forget", args))["error"]["code"] == "gate_failed"
        [request] = await pending(loc, offline_env)
        assert (request["agent_id"], request["principal"], request["target"]) == (C["agent_id"], C["principal"], mine)
        assert await pending(loc, offline_env, "--scope", f"{A['tenant']}/{A['workspace']}") == []
        await run_ok(["approve", "--request", request["request_id"], "--reason", REASON, *loc], offline_env)
        retried = await relay.call("forget", args)
        assert retried["ok"] and retried["output"]["value"]["replayed"] is True, retried
        assert (await relay.call("get", get_args(mine)))["error"]["code"] == "NOT_FOUND"
        assert (await owner.call("search", search_args("relayed")))["ok"]
