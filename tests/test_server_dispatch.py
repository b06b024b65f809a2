"""In-process: the real server over a real engine whose store has failed underneath it.

No handler exception may reach the wire: a failure is a catalog envelope, and a mutation
whose outcome is unknown says so (the caller retries with the same key)."""

from __future__ import annotations

import pytest
from mcp import Client

from engram_memory.server.app import build_server
from engram_memory.server.config import load_config
from engram_memory.server.launch import launch_dispatcher, open_engine
from engram_memory.server.tools import instructions
from tests.conftest import CONTEXT, capture_args, check_result, search_args

pytestmark = pytest.mark.anyio


async def test_store_failure_becomes_an_envelope(data_dir_factory) -> None:
    cfg = load_config(CONTEXT | {"tools": "search,get,capture,request_admission",
                                 "data_dir": data_dir_factory("broken"), "semantic": False})
    engine = open_engine(cfg)
    server = build_server(launch_dispatcher(cfg, engine), instructions(cfg.semantic))
    async with Client(server, mode="legacy") as c:
        assert check_result(await c.call_tool("engram_memory_search", search_args("before")))["ok"]
        cap = check_result(await c.call_tool("engram_memory_capture", capture_args("Kept before the failure.")))
        adm = check_result(await c.call_tool("engram_memory_request_admission", {
            "candidate_id": cap["output"]["value"]["candidate_id"], "idempotency_key": "admit-before-failure"}))
        record_id = adm["output"]["value"]["outcome"]["record_id"]
        engine.audit.close()  # its thread holds a cursor: stop it first, then
        engine.db.close()  # the store goes away under a live server
        # Eligibility is answered from memory; the record body is not cached yet, so the read
        # needs the store and must say it is unavailable (retriable), not raise.
        read = check_result(await c.call_tool("engram_memory_get", {"record_id": record_id,
                                                                    "purpose_ref": CONTEXT["purpose_ref"]}))
        assert read["error"]["code"] == "STORE_UNAVAILABLE" and read["error"]["retriable"] is True
        write = check_result(await c.call_tool("engram_memory_capture", capture_args("Lost write?")))
        assert write["error"] == {
            "code": "MUTATION_OUTCOME_UNKNOWN",
            "message": "The operation may have been applied; retry with the same key and arguments.",
            "retriable": True,
        }
