"""stdio with an answer for every frame: the SDK's transport, with protocol errors it drops.

The SDK's stdio reader hands a frame it cannot parse to the session as an exception, and the
session drops it: a non-JSON line, a wrong ``jsonrpc`` version, a lone surrogate escape
(``"\\ud800"``, which strict JSON parsers refuse) or invalid UTF-8 got no reply at all, and
a request among them was left waiting forever. Here each such frame gets the JSON-RPC error
it deserves, with the request's own id whenever the frame has one: -32700 for what is not
JSON (or not UTF-8), -32600 for what is not a valid request, -32602 for a request whose
params carry text that is not Unicode. Nothing of the input is echoed. Notifications (no id)
get no reply, as JSON-RPC says.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import ObjectReceiveStream, ObjectSendStream
from mcp.server import stdio as sdk_stdio
from mcp.shared.message import SessionMessage

PARSE_ERROR = (-32700, "Parse error")
INVALID_REQUEST = (-32600, "Invalid Request")
INVALID_PARAMS = (-32602, "Invalid params")
_NOT_UTF8 = "\x00engram: not UTF-8\n"  # stands in for an undecodable line; never valid JSON


class RecordingLines:
    """stdin as UTF-8 lines for the SDK's reader, remembering the last raw line it handed over."""

    def __init__(self, buffer: Any) -> None:
        self._file = anyio.wrap_file(buffer)
        self.last = ""

    def __aiter__(self) -> RecordingLines:
        return self

    async def __anext__(self) -> str:
        raw: bytes = await self._file.readline()
        if not raw:
            raise StopAsyncIteration
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            line = _NOT_UTF8
        self.last = line
        return line


def _has_lone_surrogate(value: Any) -> bool:
    """Iterative: a frame may nest deeper than Python's recursion limit."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if any("\ud800" <= ch <= "\udfff" for ch in item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def error_reply(raw: str) -> types.JSONRPCError | None:
    """The JSON-RPC error for a frame the SDK refused; None for a notification."""
    if raw == _NOT_UTF8:
        return _error(None, PARSE_ERROR)
    try:
        frame = json.loads(raw)  # Python's parser keeps lone surrogates; strict ones refuse them
    except (ValueError, RecursionError):
        return _error(None, PARSE_ERROR)
    if not isinstance(frame, dict):
        return _error(None, INVALID_REQUEST)
    request_id = frame.get("id")
    valid_id = isinstance(request_id, (int, str)) and not isinstance(request_id, bool)
    if isinstance(request_id, str) and _has_lone_surrogate(request_id):
        valid_id = False
    if "id" not in frame and isinstance(frame.get("method"), str):
        return None  # a notification: never answered
    reply_id = request_id if valid_id else None
    if frame.get("jsonrpc") != "2.0" or not isinstance(frame.get("method"), str):
        return _error(reply_id, INVALID_REQUEST)
    if _has_lone_surrogate(frame.get("method")):
        return _error(reply_id, INVALID_REQUEST)
    if _has_lone_surrogate(frame.get("params")):
        return _error(reply_id, INVALID_PARAMS)
    return _error(reply_id, INVALID_REQUEST)


def _error(request_id: int | str | None, code_message: tuple[int, str]) -> types.JSONRPCError:
    code, message = code_message
    return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=types.ErrorData(code=code, message=message))


@asynccontextmanager
async def stdio_server() -> AsyncIterator[
    tuple[ObjectReceiveStream[SessionMessage | Exception], ObjectSendStream[SessionMessage]]
]:
    """The SDK's stdio transport (fd 0 and 1 claimed the same way), answering refused frames."""
    # The SDK's own claim of fd 0 (diverted to the null device while serving), so that the
    # raw line of a refused frame is at hand; pinned SDK version (pyproject).
    buffer, restore = sdk_stdio._claim_fd(0, sys.stdin, "rb", sdk_stdio._open_stdin_diversion)
    lines = RecordingLines(buffer)
    try:
        async with sdk_stdio.stdio_server(stdin=lines) as (read_stream, write_stream):  # type: ignore[arg-type]
            send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)

            async def pump() -> None:
                async with send:
                    async for item in read_stream:
                        if isinstance(item, Exception):
                            # Read before any await: the SDK reader is parked until we take the
                            # next item, so ``lines.last`` is this frame's line.
                            try:
                                reply = error_reply(lines.last)
                            except Exception:  # one bad frame must never end the transport
                                reply = _error(None, INVALID_REQUEST)
                            if reply is not None:
                                await write_stream.send(SessionMessage(reply))
                            continue
                        await send.send(item)

            async with anyio.create_task_group() as tg:
                tg.start_soon(pump)
                try:
                    yield receive, write_stream
                finally:
                    tg.cancel_scope.cancel()
    finally:
        if restore is not None:
            restore()
