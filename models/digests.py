"""Digest and identifier helpers, byte-compatible with the reference engine (REFERENCE_CONTRACT §1.3-1.5)."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from engram_memory.models.canonical import canonical_bytes

ZERO_DIGEST = "sha256:" + "0" * 64
DOMAIN_PREFIX = "graphify-memory"  # kept after the upstream rename: stored digests depend on it


def digest(domain: str, value: Any) -> str:
    h = hashlib.sha256(domain.encode("utf-8") + canonical_bytes(value))
    return "sha256:" + h.hexdigest()


def receipt_digest(kind: str, obj: dict[str, Any], field: str = "receipt_digest") -> str:
    body = {k: v for k, v in obj.items() if k != field}
    return digest(f"{DOMAIN_PREFIX}/{kind}/v1\0", body)


def digest_bytes(kind: str, canonical: bytes) -> str:
    """receipt_digest over an object already serialised canonically (without its digest field)."""
    return "sha256:" + hashlib.sha256(f"{DOMAIN_PREFIX}/{kind}/v1\0".encode() + canonical).hexdigest()


def payload_digest(payload: dict[str, Any]) -> str:
    return digest(f"{DOMAIN_PREFIX}/payload/v2\0", payload)


def record_digest(record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k not in ("record_id", "record_digest")}
    return digest(f"{DOMAIN_PREFIX}/record/v2\0", body)


def record_id_from_digest(rec_digest: str) -> str:
    raw = bytes.fromhex(rec_digest.removeprefix("sha256:"))
    return "mem_" + base64.b32encode(raw).decode("ascii").rstrip("=").lower()


def candidate_id(source_ref: str, sequence: str, idempotency_key: str) -> str:
    d = receipt_digest(
        "capture-identity",
        {"source_ref": source_ref, "sequence": sequence, "idempotency_key": idempotency_key},
    )
    return "candidate_" + d.removeprefix("sha256:")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
