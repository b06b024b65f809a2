"""Raw frames written straight to the stdio transport: every request gets an answer, with its
own id when it has one, nothing of the input is echoed, and the server stays up."""

from __future__ import annotations

import json
import select
import subprocess
from typing import Any

import pytest

from tests.conftest import serve_argv

FRAMES: list[tuple[str, bytes, Any, int]] = [  # name, raw line, expected id, expected code
    ("not json", b"this is not json", None, -32700),
    ("lone surrogate in params", b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":'
     b'"engram_memory_search","arguments":{"query":"\\ud800 secret-marker","purpose_ref":"p"}}}', 2, -32602),
    ("lone surrogate in method", b'{"jsonrpc":"2.0","id":"s","method":"tools/\\udfff"}', "s", -32600),
    ("wrong jsonrpc version", b'{"jsonrpc":"1.0","id":3,"method":"tools/list"}', 3, -32600),
    ("no method", b'{"jsonrpc":"2.0","id":6}', 6, -32600),
    ("invalid utf-8", b'{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{"x":"\xff\xfe"}}', None, -32700),
    ("array", b"[1,2]", None, -32600),
    ("deep nesting", b"[" * 100_000 + b"]" * 100_000, None, -32700),
    # the SDK put the method name in the error's data
    ("unknown method", b'{"jsonrpc":"2.0","id":10,"method":"secret-marker/x"}', 10, -32601),
    ("unserved method", b'{"jsonrpc":"2.0","id":11,"method":"prompts/get","params":{"name":"secret-marker"}}',
     11, -32601),
]


def test_every_refused_frame_gets_its_error_and_the_server_stays_up(data_dir_factory, offline_env) -> None:
    proc = subprocess.Popen(serve_argv(data_dir_factory("frames"), extra=["--no-semantic"]), env=offline_env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None

    def send(raw: bytes) -> None:
        proc.stdin.write(raw + b"\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]

    def answer(timeout: float = 20) -> dict[str, Any]:
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        assert ready, "no answer"
        return json.loads(proc.stdout.readline())  # type: ignore[union-attr]

    try:
        send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
            .encode())
        assert answer()["id"] == 1
        send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        send(b'{"jsonrpc":"1.0","method":"notifications/whatever"}')  # a notification: never answered
        for name, raw, expected_id, code in FRAMES:
            send(raw)
            reply = answer()
            assert reply == {"jsonrpc": "2.0", "id": expected_id, "error": reply["error"]}, name
            assert reply["error"]["code"] == code, name
            assert "secret-marker" not in json.dumps(reply), name  # never echoes input
        send(b'{"jsonrpc":"2.0","id":99,"method":"tools/list"}')
        listed = answer()
        assert listed["id"] == 99 and len(listed["result"]["tools"]) == 6  # still serving
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.parametrize("raw,expected", [
    ("{", (None, -32700)),
    ('{"jsonrpc":"2.0","id":true,"method":"x"}', (None, -32600)),
    ('{"jsonrpc":"2.0","id":"\\ud800","method":"x"}', (None, -32600)),
])
def test_error_reply_units(raw: str, expected: tuple[Any, int]) -> None:
    from engram_memory.server.stdio import error_reply

    reply = error_reply(raw)
    assert reply is not None and (reply.id, reply.error.code) == expected
