"""An import item's checks, the same on the importing process and on its worker
(store/host/import_worker.py): the capture arguments with their content-derived idempotency key,
validated as capture validates them, and the payload digest its record will have."""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import ValidationError

from engram_memory.models.canonical import CanonicalizationError, canonical_bytes
from engram_memory.models.digests import payload_digest
from engram_memory.models.errors import EngramError
from engram_memory.models.tools import CaptureInput, parse_input, to_plain

UNPAIRED = "INVALID_SCHEMA: text holds an unpaired surrogate (not valid Unicode)"


def _keyed(args: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The capture arguments with their content-derived idempotency key, and the admission's key."""
    digest = hashlib.sha256(canonical_bytes(args)).hexdigest()[:48]
    return {"idempotency_key": f"import-capture-{digest}", **args}, f"import-admit-{digest}"


def _refusal(exc: EngramError) -> str:
    # The detail is the store's own wording or validation paths and kinds, never a value.
    return f"{exc.code}: {exc.detail}" if exc.detail else exc.code


def _check_args(scope_ref: str, raw: dict[str, Any]) -> tuple[dict[str, Any], str, str] | str:
    """An item's capture arguments checked as capture checks them: its plain arguments (with their
    idempotency key), its admission's key and its record's payload digest -- or the reason it is
    invalid. A pure function of the item: the import worker runs it too (store/host/import_worker.py)."""
    try:
        args, admit_key = _keyed(raw)
        capture = parse_input("capture", args)
    except EngramError as exc:
        return _refusal(exc)
    except CanonicalizationError:
        return UNPAIRED
    except (ValueError, TypeError, RecursionError, ValidationError) as exc:
        return f"INVALID_SCHEMA: {type(exc).__name__}"
    assert isinstance(capture, CaptureInput)
    plain = to_plain(capture)
    # What the record's payload digest will be: the payload as captured (an export's carries its
    # retention and reconciliation, a graph item's sets them), bound to the scope.
    return plain, admit_key, payload_digest({**plain["payload"], "scope_ref": scope_ref})
