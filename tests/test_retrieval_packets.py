"""Packets are serialised from cached pieces; the pieces must give exactly the JCS bytes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engram_memory.models.canonical import canonical_bytes
from engram_memory.retrieval.packets import core_bytes, ranked_packet_bytes, redact

RECORD = {
    "record_id": "mem_" + "a" * 52,
    "record_digest": "sha256:" + "b" * 64,
    "scope_ref": "tenant:t/workspace:w",
    "components": [{"component_id": "c1", "kind": "decision", "text": "caf\u00e9 \u2603 \"quoted\"\n",
                    "citation_ids": ["s1"]}],
    "valid_time": {"t": 1_780_000_000_000},
}


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(st.characters(exclude_categories=("Cs",)), max_size=40),
    # scores are cosines and fused scores: finite, far inside the safe-integer range; never -0.0
    score=st.floats(-1e6, 1e6, allow_nan=False).filter(lambda x: x != 0 or str(x) == "0.0"),
    rank=st.integers(1, 10_000),
    redacted=st.sampled_from([(), ("scope_ref",), ("scope_ref", "components", "valid_time")]),
)
def test_assembled_packet_bytes_equal_jcs(text: str, score: float, rank: int, redacted: tuple[str, ...]) -> None:
    record = {**RECORD, "components": [{**RECORD["components"][0], "text": text}]}
    core = redact(record, redacted, "policy:v1")
    assert b"{" + core_bytes(core) + b"}" == canonical_bytes(core)
    assert ranked_packet_bytes(core_bytes(core), score, rank) == canonical_bytes({**core, "score": score, "rank": rank})
