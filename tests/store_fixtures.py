"""Builders for valid tool arguments (plain dicts, as models.tools.to_plain produces them)."""

from __future__ import annotations

import hashlib
from typing import Any

from engram_memory.models.context import HostContext
from engram_memory.models.limits import RERANK_HEAD, RERANK_WEIGHTS, TURN_TYPES

T0 = 1_780_000_000_000  # 2026-05-28T20:26:40.000Z
PURPOSE = "purpose:test"
# What every receipt's fusion.rerank says.
RERANK = {"head": RERANK_HEAD, "weights": dict(RERANK_WEIGHTS), "turn_types": list(TURN_TYPES)}


def ctx(tenant: str = "acme", workspace: str = "main", principal: str = "alice") -> HostContext:
    return HostContext(tenant=tenant, workspace=workspace, principal=principal, agent_id="agent-1",
                       purpose_ref=PURPOSE)


def sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def capture_args(text: str, key: str = "capture-key-000001", **payload_extra: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "schema_version": 2,
        "purpose_ref": PURPOSE,
        "valid_time": {"t": T0 - 86_400_000},
        "components": [{"component_id": "c1", "kind": "decision", "text": text, "citation_ids": ["s1"]}],
        "primary_component_id": "c1",
        "primary_event": {"at": T0 - 86_400_000, "type_ref": "event:decided", "citation_id": "s1"},
        "citations": [
            {
                "citation_id": "s1",
                "source_ref": "doc:adr-7",
                "locator": {"scheme": "path", "value": "docs/adr-7.md#L3"},
                "content_digest": sha(text),
            }
        ],
        **payload_extra,
    }
    return {
        "idempotency_key": key,
        "payload": payload,
        "evidence": {"evidence_ref": "ev:1", "evidence_digest": sha("ev" + text), "citation_ids": ["s1"]},
    }


# Each agent-written value of one capture, its admission and its forget: invented, so a hit names
# what leaked. (The forget's reason_ref is the one agent value kept: the journal is the permanent,
# hash-chained account of what was done and why; SECURITY.md, "What each column holds".)
AGENT_FIELDS = {
    "text": "Decision: the fraxwumble quintorell rollout waits for the yearly audit.",
    "component_id": "cmp-QXJWVORTEZ",
    "citation_id": "cit-KWPLMNBRAX",
    "source_ref": "doc:src-QUVBRNZEXT",
    "locator_scheme": "scheme-PLRWQZTX",
    "locator": "docs/loc-XJTRWQPLUM.md#L9",
    "type_ref": "event:ZORBLUXEVT",
    "evidence_ref": "ev:EVD-QWXYZPLOK",
    "capture_key": "idk-capture-WQZLXPTRVB",
    "admission_key": "idk-admit-MNQRZXWPLT",
    "forget_key": "idk-forget-BRQZXWLMPT",
}
IDEMPOTENCY_FIELDS = ("capture_key", "admission_key", "forget_key")


def unique_capture() -> dict[str, Any]:
    f = AGENT_FIELDS
    args = capture_args(f["text"], key=f["capture_key"])
    payload = args["payload"]
    payload["components"][0].update(component_id=f["component_id"], citation_ids=[f["citation_id"]])
    payload["primary_component_id"] = f["component_id"]
    payload["primary_event"].update(type_ref=f["type_ref"], citation_id=f["citation_id"])
    payload["citations"][0].update(citation_id=f["citation_id"], source_ref=f["source_ref"],
                                   locator={"scheme": f["locator_scheme"], "value": f["locator"]})
    args["evidence"].update(evidence_ref=f["evidence_ref"], citation_ids=[f["citation_id"]])
    return args


def admission_args(candidate_id: str, key: str = "admit-key-0000001") -> dict[str, Any]:
    return {"candidate_id": candidate_id, "idempotency_key": key}


def withdraw_args(candidate_id: str, key: str = "withdraw-key-00001") -> dict[str, Any]:
    return {"candidate_id": candidate_id, "idempotency_key": key, "reason_ref": "reason:obsolete"}


def forget_args(record_id: str, key: str = "forget-key-0000001") -> dict[str, Any]:
    return {"record_id": record_id, "idempotency_key": key, "reason_ref": "reason:user-request"}


def call(engine: Any, tool: str, c: HostContext, args: dict[str, Any]) -> dict[str, Any]:
    """One engine operation the way the server calls it: validated input model in, value out
    (as the plain dict the wire carries)."""
    from engram_memory.models.tools import parse_input, to_plain

    return to_plain(getattr(engine, tool)(c, parse_input(tool, args)))


def admit_texts(engine: Any, texts: list[str], *, settle_each: bool = False) -> list[str]:
    """Capture and admit each text (accepted); the record ids. ``settle_each`` projects every
    admission before the next (store/core/projector.py groups them otherwise)."""
    ids = []
    for i, text in enumerate(texts):
        cap = call(engine, "capture", ctx(), capture_args(text, key=f"capture-key-{i:06d}"))
        out = call(engine, "request_admission", ctx(), admission_args(cap["candidate_id"], key=f"admit-key-{i:08d}"))
        assert out["outcome"]["status"] == "accepted", out
        ids.append(out["outcome"]["record_id"])
        if settle_each:
            engine.settle()
    return ids
