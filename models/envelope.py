"""The result envelope every tool returns."""

from __future__ import annotations

import base64
import secrets
from typing import Any

from engram_memory.models.errors import CATALOG, ErrorCode

REDACTION_CLASS = "high"


def new_audit_id() -> str:
    """"aud_" + 26 lowercase base32 characters (128 random bits)."""
    return "aud_" + base64.b32encode(secrets.token_bytes(16)).decode("ascii").rstrip("=").lower()


def success(value: dict[str, Any], audit_id: str) -> dict[str, Any]:
    return {
        "ok": True,
        "output": {"schema_version": 1, "value": value},
        "auditId": audit_id,
        "redactionClass": REDACTION_CLASS,
    }


def failure(code: ErrorCode | str, audit_id: str) -> dict[str, Any]:
    code = ErrorCode(code)
    spec = CATALOG[code]
    return {
        "ok": False,
        "auditId": audit_id,
        "redactionClass": REDACTION_CLASS,
        "error": {"code": code.value, "message": spec.message, "retriable": spec.retriable},
    }
