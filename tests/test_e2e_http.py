"""End to end over streamable HTTP on loopback: same launch-bound context, same gate.

Handshake-era clients get elicitation/create on the call's SSE stream; 2026-era clients
get the InputRequiredResult round trip."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
from mcp import Client

from tests.conftest import Human, capture_args, check_result, get_args, key, search_args, serve_argv

pytestmark = pytest.mark.anyio


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server(data_dir_factory, offline_env) -> Iterator[str]:
    port = free_port()
    data_dir = data_dir_factory("http")
    argv = serve_argv(data_dir, extra=["--no-semantic", "--transport", "http", "--port", str(port)])
    log = (data_dir.parent / f"http-{port}.stderr").open("w")
    proc = subprocess.Popen(argv, env=offline_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "server exited early"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "server did not listen"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        log.close()
    assert out == b""  # stdout stays silent over HTTP too


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_http_story_with_confirmation(http_server: str, mode: str) -> None:
    human = Human(answers=["decline", "accept"])
    async with Client(http_server, elicitation_callback=human, mode=mode) as c:
        names = [t.name for t in (await c.list_tools()).tools]
        assert "engram_memory_forget" in names
        text = f"HTTP serves the same launch-bound context ({mode})."
        cap = check_result(await c.call_tool("engram_memory_capture", capture_args(text)))
        candidate_id = cap["output"]["value"]["candidate_id"]
        adm = check_result(await c.call_tool("engram_memory_request_admission",
                                             {"candidate_id": candidate_id, "idempotency_key": key("adm")}))
        record_id = adm["output"]["value"]["outcome"]["record_id"]
        found = check_result(await c.call_tool("engram_memory_search", search_args("launch-bound context")))
        assert record_id in [p["record"]["record_id"] for p in found["output"]["value"]["records"]]

        args = {"record_id": record_id, "idempotency_key": key("forget"), "reason_ref": "reason:x"}
        declined = check_result(await c.call_tool("engram_memory_forget", args))
        assert declined["error"]["code"] == "gate_failed"
        assert check_result(await c.call_tool("engram_memory_forget", args))["ok"]
        gone = check_result(await c.call_tool("engram_memory_get", get_args(record_id)))
        assert gone["error"]["code"] == "NOT_FOUND"
        assert len(human.prompts) == 2
