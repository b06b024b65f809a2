"""Hostile input (issue "Prove it", item 3): schema-generated, mutated tool arguments through the REAL
MCP SDK client (and raw frames for what it cannot send) to real stdio servers. Every answer is an
envelope with a catalog code or an allowed JSON-RPC error, nothing echoes the planted marker, every
call is answered, the server stays up and refused calls leave the store unchanged.

The long run: ``engram-memory fuzz --calls 100000 --seed N --out out/fuzz`` (checks/fuzz.py)."""

from __future__ import annotations

import json
import subprocess

from engram_memory.checks.fuzz import PURPOSE, RawClient, nest, offline_env, run_fuzz, serve_argv


def test_fuzzed_calls_keep_the_contract(tmp_path) -> None:
    summary = run_fuzz(1500, 20261203, tmp_path, timeout=10)
    report = summary.as_json()
    assert summary.calls == 1500
    assert report["per_outcome"].get("INVALID_SCHEMA", 0) > 500  # the schema step is what gets exercised
    assert not summary.violations, json.dumps(summary.violations[:5], indent=1)


def test_deeply_nested_arguments_in_a_raw_frame_get_an_answer(tmp_path) -> None:
    """Depth 400 inside ``arguments``: valid JSON for Python's parser. Regression for the RecursionError
    in server/stdio.py ``_has_lone_surrogate`` that took the whole stdio server down."""
    client = RawClient(serve_argv(tmp_path / "d", False), offline_env(), subprocess.DEVNULL)
    try:
        frame = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "engram_memory_search", "arguments": {"query": nest(400, "x"), "purpose_ref": PURPOSE}}}
        client.send(json.dumps(frame).encode())
        reply = client.answer(10)
        assert reply["id"] == 1 and ("error" in reply or reply["result"]["isError"])
        client.send(b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}')
        assert len(client.answer(10)["result"]["tools"]) == 6
    finally:
        client.close()
