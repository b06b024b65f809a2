"""What an operator reads at the default log level: a plain launch, a relay session and a server
closed while its model still loads say only what engram-memory itself has to say (no uvicorn,
SDK, HTTP client or model-loading chatter, no refused contexts of our own relay, no traceback)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import anyio
import pytest

from tests.conftest import capture_args, key, mcp_server, search_args, serve_argv

pytestmark = pytest.mark.anyio

OURS = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR) engram(_memory)?\.[\w.]+: ")


def default_level(argv: list[str]) -> list[str]:
    """serve_argv asks for DEBUG; an operator runs at the default (INFO)."""
    at = argv.index("--log-level")
    return argv[:at] + argv[at + 2:]


def operator_lines(stderr: str) -> list[str]:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    for line in lines:
        assert OURS.match(line), f"a line that is not engram-memory's own: {line!r}\n{stderr}"
    assert "Traceback" not in stderr
    return lines


async def test_a_plain_launch_logs_what_it_serves_and_nothing_else(data_dir_factory, offline_env) -> None:
    data_dir = data_dir_factory("logs-plain") / "data"
    async with mcp_server(default_level(serve_argv(data_dir)), offline_env) as mcp:
        assert (await mcp.call("search", search_args("anything at all")))["ok"]
        for _ in range(300):  # until the model is loaded and the semantic channel answers
            if (await mcp.call("search", search_args("q", capability_policy={
                    "minimum_channels": "lexical_and_semantic", "network": "forbid"})))["ok"]:
                break
            await anyio.sleep(0.2)
        else:
            pytest.fail("the model never loaded")
        stderr_path = mcp.stderr_path
    lines = operator_lines(stderr_path.read_text())
    assert not [ln for ln in lines if " WARNING " in ln or " ERROR " in ln], lines
    assert any("serving over stdio" in ln for ln in lines)


async def test_a_relay_session_is_quiet_on_both_sides(data_dir_factory, offline_env) -> None:
    data_dir = data_dir_factory("logs-relay") / "data"
    argv = default_level(serve_argv(data_dir, extra=["--no-semantic"]))
    async with mcp_server(argv, offline_env, log_dir=data_dir.parent) as owner:
        async with mcp_server(argv, offline_env, log_dir=data_dir.parent) as relay:
            cap = await relay.call("capture", capture_args("A relayed capture logs nothing of its plumbing."))
            assert cap["ok"], cap
            adm = await relay.call("request_admission", {"candidate_id": cap["output"]["value"]["candidate_id"],
                                                         "idempotency_key": key("adm")})
            assert adm["ok"], adm
            assert (await relay.call("search", search_args("relayed capture")))["ok"]
            relay_log = relay.stderr_path
        owner_log = owner.stderr_path
    relayed = operator_lines(relay_log.read_text())
    assert any("relaying this host's calls" in ln for ln in relayed), relayed
    owned = operator_lines(owner_log.read_text())
    assert not [ln for ln in owned + relayed if " WARNING " in ln or " ERROR " in ln], owned + relayed


def test_closing_while_the_model_loads_is_a_clean_exit(data_dir_factory, offline_env) -> None:
    data_dir = data_dir_factory("logs-early") / "data"
    proc = subprocess.Popen(default_level(serve_argv(data_dir)), env=offline_env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    proc.stdin.write((json.dumps(initialize) + "\n").encode())
    proc.stdin.flush()
    answer = json.loads(proc.stdout.readline())
    assert answer["id"] == 1 and "result" in answer
    # The host goes away a moment after launch (stdin closed), long before the model is loaded.
    _, err = proc.communicate(input=b"", timeout=120)
    assert proc.returncode == 0, err.decode()
    stderr = err.decode()
    lines = operator_lines(stderr)
    assert not [ln for ln in lines if " WARNING " in ln or " ERROR " in ln], stderr
    assert "FakeTensor" not in stderr and "prims" not in stderr
    assert not (Path(data_dir) / "engram.sock").exists()  # closed cleanly: the owner socket is gone
