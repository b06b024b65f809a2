"""End to end with the SDK's high-level Client in auto mode: it negotiates the 2026-07-28
protocol, which forbids server-to-client requests, so confirmation travels as an
InputRequiredResult plus a signed request_state (multi round trip) instead of elicitation/create."""

from __future__ import annotations

import pytest
from mcp import Client, StdioServerParameters
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from tests.conftest import DUCKDB, REPO, Backend, Human, capture_args, check_result, get_args, key, serve_argv

pytestmark = pytest.mark.anyio


def client(data_dir, offline_env, human: Human | None, backend: Backend = DUCKDB,
           extra: tuple[str, ...] = ()) -> Client:
    argv = serve_argv(data_dir, extra=["--no-semantic", *extra], backend=backend)
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=offline_env, cwd=str(REPO))
    return Client(params, elicitation_callback=human, mode="auto")


async def call(c: Client, tool: str, args: dict) -> dict:
    return check_result(await c.call_tool("engram_memory_" + tool, args))


async def test_modern_client_confirms_through_input_required(data_dir_factory, offline_env, backend) -> None:
    human = Human(answers=["decline", "accept"])
    async with client(data_dir_factory("modern"), offline_env, human, backend) as c:
        assert c.protocol_version in MODERN_PROTOCOL_VERSIONS
        assert "Search before capture" in (c.instructions or "")
        cap = await call(c, "capture", capture_args("Modern clients confirm through input_required."))
        candidate_id = cap["output"]["value"]["candidate_id"]
        adm = await call(c, "request_admission", {"candidate_id": candidate_id, "idempotency_key": key("adm")})
        record_id = adm["output"]["value"]["outcome"]["record_id"]

        args = {"record_id": record_id, "idempotency_key": key("forget"), "reason_ref": "reason:x"}
        declined = await call(c, "forget", args)
        assert declined["error"]["code"] == "gate_failed"
        assert (await call(c, "get", get_args(record_id)))["ok"]

        forgot = await call(c, "forget", args)
        assert forgot["ok"], forgot
        assert len(human.prompts) == 2 and record_id in human.prompts[1].message
        assert (await call(c, "get", get_args(record_id)))["error"]["code"] == "NOT_FOUND"


async def test_modern_client_without_elicitation_waits_for_the_operator(data_dir_factory, offline_env) -> None:
    """Parked for the operator (tests/test_approvals.py): gate_failed until approved at the host."""
    async with client(data_dir_factory("modern-queued"), offline_env, None) as c:
        out = await call(c, "forget", {"record_id": "mem_abc", "idempotency_key": key("f"), "reason_ref": "reason:x"})
        assert out["error"]["code"] == "gate_failed"


async def test_modern_client_without_elicitation_cannot_forget(data_dir_factory, offline_env) -> None:
    """With the host's queue off (confirm_fallback = "off"): a missing confirmation, -32603."""
    from mcp.shared.exceptions import MCPError

    async with client(data_dir_factory("modern-noelicit"), offline_env, None,
                      extra=("--confirm-fallback", "off")) as c:
        with pytest.raises(MCPError) as info:
            await c.call_tool("engram_memory_forget", {"record_id": "mem_abc", "idempotency_key": key("f"),
                                                       "reason_ref": "reason:x"})
        assert (info.value.code, info.value.message) == (-32603, "Trusted invocation context unavailable")
