"""Record packets: host redaction by omission, packet digests and the byte budget."""

from __future__ import annotations

from typing import Any

from engram_memory.models.canonical import canonical_bytes
from engram_memory.models.digests import receipt_digest


def redact(record: dict[str, Any], redacted: tuple[str, ...], policy_version: str) -> dict[str, Any]:
    """Apply the host's field policy by omission (REFERENCE §10.9); record_id always stays."""
    kept = {k: v for k, v in record.items() if k == "record_id" or k not in redacted}
    removed = sorted("/" + k.replace("~", "~0").replace("/", "~1") for k in record if k not in kept)
    return {
        "record": kept,
        "redacted_fields": removed,
        "redaction_receipt_digest": receipt_digest(
            "recall-redaction",
            {
                "record_id": record["record_id"],
                "source_record_digest": record["record_digest"],
                "policy_version": policy_version,
                "redacted_fields": removed,
            },
            "redaction_receipt_digest",
        ),
    }


def core_bytes(core: dict[str, Any]) -> bytes:
    """The JCS members of a redacted core ``{record, redacted_fields, redaction_receipt_digest}``
    without braces: the middle of a packet (its keys sort between "rank" and "score")."""
    return (b'"record":' + canonical_bytes(core["record"])
            + b',"redacted_fields":' + canonical_bytes(core["redacted_fields"])
            + b',"redaction_receipt_digest":' + canonical_bytes(core["redaction_receipt_digest"]))


def ranked_packet_bytes(core: bytes, score: float, rank: int) -> bytes:
    """canonical_bytes({**core, "score": score, "rank": rank}) from the core's cached bytes."""
    return b'{"rank":' + canonical_bytes(rank) + b"," + core + b',"score":' + canonical_bytes(score) + b"}"
