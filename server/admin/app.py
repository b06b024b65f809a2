"""``engram-memory admin``: the typer app, built from every command group of server/admin/.

verify, backup, restore (maintenance.py); expire, adjudicate, history, candidates (review.py);
rotate-master-key, init-store, migrate (store_setup.py); approvals, approve, deny (approvals.py);
explain, check-receipt (explain.py); dispute, resolve, supersede, revoke-trust, rewind
(lifecycle.py); export, import (transfer.py). Each prints a table (stdout) or, with ``--json``, one
JSON document. A mistake of the operator is one ``engram-memory: error:`` line and exit 2; a
refusal is one line naming its code (store/core/refusals.py: BACKUP_INVALID, RESTORE_REFUSED,
JOURNAL_CORRUPT, STORE_BUSY, STORE_INCONSISTENT, NOT_ADJUDICABLE) and exit 1. Only ``backup`` runs
alongside a server (the owner makes the copy over its socket); every other command refuses while
another process holds the data dir. On a PostgreSQL store (``--store URL --master-key-file FILE``,
or ENGRAM_STORE and ENGRAM_MASTER_KEY_FILE) verify, expire, adjudicate, history and candidates run
against the live store: it is shared and transactional. rotate-master-key refuses while nodes run.
"""

from __future__ import annotations

import typer

from engram_memory.server.admin import (
    approvals,
    explain,
    lifecycle,
    maintenance,
    review,
    store_setup,
    transfer,
)

admin_app = typer.Typer(
    name="admin",
    help="Host-only maintenance: verify, backup/restore, expire, adjudicate, history, key rotation, lifecycle"
    " operations (dispute, resolve, supersede, revoke-trust, rewind).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# In this order: `admin --help` lists the commands as they are registered.
for group in (maintenance, review, store_setup, approvals, explain, lifecycle, transfer):
    admin_app.add_typer(group.commands)
