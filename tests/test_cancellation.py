"""MCP cancellation: a cancelled mutation is applied wholly or not at all, and a retry with
the same key reports which (real server over stdio, the SDK's courtesy notifications/cancelled)."""

from __future__ import annotations

from typing import Any

import anyio
import duckdb
import pytest

from tests.conftest import capture_args, key, search_args

pytestmark = pytest.mark.anyio


async def test_cancelled_mutations_are_all_or_nothing(start_server: Any, data_dir_factory: Any) -> None:
    data_dir = data_dir_factory("cancel") / "data"
    attempts = 12
    outcomes: list[str] = []
    async with start_server(data_dir, extra=["--no-semantic"]) as mcp:
        assert (await mcp.call("search", search_args("warm up")))["ok"]
        for i in range(attempts):
            args = capture_args(f"Cancelled capture number {i} is applied once or not at all.", key=key(f"cx{i}"))
            # Cancel at varied points: before sending, in flight, after the engine answered.
            with anyio.move_on_after(0.002 * i):
                await mcp.session.call_tool("engram_memory_capture", args)
            retry = await mcp.call("capture", args)  # same key, same arguments: the truth
            assert retry["ok"], retry
            outcomes.append(retry["output"]["value"]["status"])
    assert set(outcomes) <= {"committed_pending", "duplicate_exact"}
    assert outcomes.count("committed_pending") >= 1  # at least one cancel landed before the commit
    con = duckdb.connect(str(data_dir / "engram.duckdb"), read_only=True)
    try:
        (candidates,) = con.execute("SELECT count(*) FROM candidates").fetchone()  # type: ignore[misc]
        codes = [r[0] for r in con.execute("SELECT code FROM audit WHERE tool = 'capture'").fetchall()]
    finally:
        con.close()
    assert candidates == attempts  # exactly one candidate per logical operation
    assert len(codes) >= attempts  # every retry is audited, and so is a call cancelled in the handler
    assert set(codes) <= {None, "CANCELLED"}
