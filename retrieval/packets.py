"""Record packets: host redaction by omission, packet digests and the byte budget."""

from __future__ import annotations

from typing import Any

from models.canonical import canonical_bytes
from models.digests import receipt_digest


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


def packet_bytes(packet: dict[str, Any]) -> int:
    return len(canonical_bytes(packet))
