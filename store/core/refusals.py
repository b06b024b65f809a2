"""Outcomes of the host-only maintenance commands (``engram-memory admin ...``).

These are command-line outcomes, not contract error codes: no agent ever sees them, and they
stay out of the MCP error catalog (models/errors.py). A refusal leaves the store unchanged.
"""

from __future__ import annotations

BACKUP_INVALID = "BACKUP_INVALID"  # the backup file is damaged, truncated, or its key does not open it
RESTORE_REFUSED = "RESTORE_REFUSED"  # the target holds another store, is in use, or would resurrect forgets
JOURNAL_CORRUPT = "JOURNAL_CORRUPT"  # a scope's hash chain, cursors or heads do not verify
STORE_INCONSISTENT = "STORE_INCONSISTENT"  # the journal verifies, but rows, keys, digests or projections disagree
STORE_BUSY = "STORE_BUSY"  # another process holds the data dir and the command is not safe alongside it
NOT_ADJUDICABLE = "NOT_ADJUDICABLE"  # the candidate is not awaiting an operator's decision
RECEIPT_MISMATCH = "RECEIPT_MISMATCH"  # a receipt does not re-derive from the store, or disagrees with itself
ILLEGAL_TRANSITION = "ILLEGAL_TRANSITION"  # a host operation the state machine does not allow from the record's state
NOTHING_MATCHES = "NOTHING_MATCHES"  # revoke-trust or a family supersede found no current record to change
UNKNOWN_REQUEST = "UNKNOWN_REQUEST"  # no request awaiting approval has this id (in this scope)
NOT_PENDING = "NOT_PENDING"  # the request awaiting approval expired or was already decided


class AdminRefusal(Exception):
    """A refusal: one line with its code, exit status 1."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class AdminUsageError(ValueError):
    """The operator's mistake (unknown candidate, bad reason): one line, exit status 2."""
