"""The confirmation gate's rules that an end-to-end run cannot reach in reasonable time:
the 30 s execution window, the TTL and tampering of the 2026-era signed request_state."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import mcp_types as types
import pytest

from engram_memory.models.context import HostContext
from engram_memory.models.errors import PROTOCOL_CONTEXT_CODE, ProtocolError
from engram_memory.server.dispatch import check_purpose, classify_unexpected, envelope_result, new_audit_id
from engram_memory.server.gate import (
    EXECUTION_WINDOW_S,
    Approval,
    ConfirmationGate,
    GateFailed,
    OperatorApproval,
    can_form_elicit,
    confirmation_message,
    is_approval,
)

pytestmark = pytest.mark.anyio

HOST = HostContext(tenant="acme", workspace="main", principal="alice", agent_id="agent-1", purpose_ref="p:x")
ARGS = {"record_id": "mem_abc", "idempotency_key": "k" * 16, "reason_ref": "reason:x"}
ACCEPT = types.ElicitResult(action="accept", content={"confirm": True})


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def ms(self) -> int:
        return int(self.now * 1000)


def modern_ctx(caps: types.ClientCapabilities | None = None) -> Any:
    form = types.ElicitationCapability(form=types.FormElicitationCapability())
    caps = caps or types.ClientCapabilities(elicitation=form)
    return SimpleNamespace(
        session=SimpleNamespace(client_capabilities=caps, can_send_request=False), protocol_version="2026-07-28"
    )


def call(arguments: dict[str, Any], state: str | None = None, answer: Any = None) -> types.CallToolRequestParams:
    return types.CallToolRequestParams(
        name="engram_memory_forget",
        arguments=arguments,
        request_state=state,
        input_responses=None if answer is None else {"confirm": answer},
    )


def test_execution_window_is_30_seconds() -> None:
    approval = Approval(approved_at=100.0)
    approval.ensure_fresh(100.0 + EXECUTION_WINDOW_S)
    with pytest.raises(GateFailed):
        approval.ensure_fresh(100.0 + EXECUTION_WINDOW_S + 0.001)


@pytest.mark.parametrize(
    "answer,ok",
    [
        (ACCEPT, True),
        (types.ElicitResult(action="accept", content={"confirm": False}), False),
        (types.ElicitResult(action="accept", content={"confirm": 1}), False),
        (types.ElicitResult(action="accept", content={"confirm": "true"}), False),
        (types.ElicitResult(action="accept"), False),
        (types.ElicitResult(action="decline"), False),
        (types.ElicitResult(action="cancel"), False),
        ({"action": "accept", "content": {"confirm": True}}, True),
        ({"nonsense": 1}, False),
    ],
)
def test_only_accept_with_confirm_true_approves(answer: Any, ok: bool) -> None:
    assert is_approval(answer) is ok


def test_form_capability() -> None:
    E = types.ElicitationCapability
    assert not can_form_elicit(None)
    assert not can_form_elicit(types.ClientCapabilities())
    assert can_form_elicit(types.ClientCapabilities(elicitation=E()))  # the pre-2025-11-25 spelling
    assert can_form_elicit(types.ClientCapabilities(elicitation=E(form=types.FormElicitationCapability())))
    assert not can_form_elicit(types.ClientCapabilities(elicitation=E(url=types.UrlElicitationCapability())))


def test_message_names_tool_and_target_only() -> None:
    msg = confirmation_message("forget", ARGS, HOST)
    assert "engram_memory_forget" in msg and "mem_abc" in msg and "agent-1" in msg
    assert "reason:x" not in msg and "k" * 16 not in msg


async def test_round_trip_approves_once() -> None:
    clock = Clock()
    gate = ConfirmationGate(frozenset(), clock=clock, wall_ms=clock.ms)
    first = await gate.confirm(modern_ctx(), call(ARGS), "forget", ARGS, HOST)
    assert isinstance(first, types.InputRequiredResult)
    assert set(first.input_requests or {}) == {"confirm"}
    state = first.request_state
    assert state
    clock.now += 5
    approval = await gate.confirm(modern_ctx(), call(ARGS, state, ACCEPT), "forget", ARGS, HOST)
    assert isinstance(approval, Approval) and approval.approved_at == clock.now
    with pytest.raises(GateFailed, match="already used"):
        await gate.confirm(modern_ctx(), call(ARGS, state, ACCEPT), "forget", ARGS, HOST)


async def test_round_trip_refusals() -> None:
    clock = Clock()
    gate = ConfirmationGate(frozenset(), ttl_s=60, clock=clock, wall_ms=clock.ms)

    async def state() -> str:
        result = await gate.confirm(modern_ctx(), call(ARGS), "forget", ARGS, HOST)
        assert isinstance(result, types.InputRequiredResult) and result.request_state
        return result.request_state

    other = ARGS | {"record_id": "mem_other"}
    with pytest.raises(GateFailed, match="another operation"):
        await gate.confirm(modern_ctx(), call(other, await state(), ACCEPT), "forget", other, HOST)
    s = await state()
    tampered = s[:-2] + ("A" if s[-2] != "A" else "B") + s[-1]
    with pytest.raises(GateFailed, match="signature"):
        await gate.confirm(modern_ctx(), call(ARGS, tampered, ACCEPT), "forget", ARGS, HOST)
    with pytest.raises(GateFailed, match="signature"):
        await gate.confirm(modern_ctx(), call(ARGS, "caf\u00e9.x", ACCEPT), "forget", ARGS, HOST)
    s = await state()
    clock.now += 61
    with pytest.raises(GateFailed, match="expired"):
        await gate.confirm(modern_ctx(), call(ARGS, s, ACCEPT), "forget", ARGS, HOST)
    declined = types.ElicitResult(action="decline")
    with pytest.raises(GateFailed, match="not approved"):
        await gate.confirm(modern_ctx(), call(ARGS, await state(), declined), "forget", ARGS, HOST)
    # A state from another process (another secret) is refused.
    foreign = await ConfirmationGate(frozenset(), clock=clock, wall_ms=clock.ms).confirm(
        modern_ctx(), call(ARGS), "forget", ARGS, HOST
    )
    assert isinstance(foreign, types.InputRequiredResult)
    with pytest.raises(GateFailed, match="signature"):
        await gate.confirm(modern_ctx(), call(ARGS, foreign.request_state, ACCEPT), "forget", ARGS, HOST)


async def test_no_elicitation_capability_is_protocol_error() -> None:
    gate = ConfirmationGate(frozenset())
    with pytest.raises(ProtocolError) as info:
        await gate.confirm(modern_ctx(types.ClientCapabilities()), call(ARGS), "forget", ARGS, HOST)
    assert info.value.code == PROTOCOL_CONTEXT_CODE


async def test_no_elicitation_goes_to_the_operator_queue_when_the_host_queues() -> None:
    """confirm_fallback = "queue" (the serve default): the dispatcher parks the call (store/host/approvals.py)."""
    gate = ConfirmationGate(frozenset(), ttl_s=42, queue=True)
    with pytest.raises(OperatorApproval) as info:
        await gate.confirm(modern_ctx(types.ClientCapabilities()), call(ARGS), "forget", ARGS, HOST)
    assert info.value.ttl_s == 42


def test_gated_tools() -> None:
    assert ConfirmationGate(frozenset()).gated == {"withdraw", "forget"}
    assert ConfirmationGate(frozenset({"capture"})).gated == {"withdraw", "forget", "capture"}


# ---- small pipeline helpers ----------------------------------------------------------------


def test_audit_ids_are_fresh_base32() -> None:
    ids = {new_audit_id() for _ in range(100)}
    assert len(ids) == 100
    for audit_id in ids:
        assert len(audit_id) == 30 and audit_id.startswith("aud_")
        assert set(audit_id[4:]) <= set("abcdefghijklmnopqrstuvwxyz234567")


def test_purpose_check() -> None:
    check_purpose("search", {"purpose_ref": "p:x"}, "p:x")
    check_purpose("search", {"query": "no purpose"}, "p:x")  # left to the schema step
    check_purpose("search", {"purpose_ref": 7}, "p:x")
    check_purpose("capture", {"payload": "not an object"}, "p:x")
    check_purpose("forget", {"purpose_ref": "other"}, "p:x")  # forget carries no purpose
    for tool, args in [("get", {"purpose_ref": "other"}), ("capture", {"payload": {"purpose_ref": "other"}}),
                       ("search", {"purpose_ref": "\ud800"})]:
        with pytest.raises(ProtocolError):
            check_purpose(tool, args, "p:x")


def test_envelope_result_copies_text() -> None:
    env = {"ok": False, "auditId": "aud_x", "redactionClass": "high",
           "error": {"code": "NOT_FOUND", "message": "The target is not available.", "retriable": False}}
    result = envelope_result(env)
    assert result.is_error is True and result.structured_content == env
    assert result.content[0].text == '{"ok":false,"auditId":"aud_x","redactionClass":"high","error":' \
        '{"code":"NOT_FOUND","message":"The target is not available.","retriable":false}}'


def test_unexpected_exceptions_map_to_catalog_codes() -> None:
    import duckdb

    # The DuckDB backend registers its driver's errors as store errors when it is imported (as the
    # server does before any call); run alone, this test imports it itself (it was order-dependent).
    import engram_memory.store.duckdb.backend  # noqa: F401

    assert classify_unexpected(duckdb.IOException("x"), "search", True) == "STORE_UNAVAILABLE"
    assert classify_unexpected(OSError("x"), "get", True) == "STORE_UNAVAILABLE"
    assert classify_unexpected(RuntimeError("x"), "get", True) == "CAPABILITY_UNAVAILABLE"
    assert classify_unexpected(duckdb.IOException("x"), "forget", True) == "MUTATION_OUTCOME_UNKNOWN"
    assert classify_unexpected(RuntimeError("x"), "capture", False) == "CAPABILITY_UNAVAILABLE"
