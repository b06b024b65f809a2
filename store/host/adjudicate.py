"""An operator's decision on a candidate held for adjudication (``admin adjudicate``).

Run with the store closed to servers (the caller checked): the engine is opened without the
embedding model; an accepted record is indexed lexically at once, and a server embeds it at
its next start (its semantic backfill embeds every current record that lacks a vector).
On a PostgreSQL store it runs against the live store (``adjudicate_with`` on an admin engine,
store/core/admin_node.py); the serving nodes index and embed the record as they catch up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engram_memory.models.settings import EngineSettings
from engram_memory.store.core.refusals import NOT_ADJUDICABLE, AdminRefusal, AdminUsageError
from engram_memory.store.screen import lazy

MAX_REASON = 500  # characters: a reason is a sentence or two, kept in the journal for good


def check_reason(reason: str) -> str:
    """The reason as journalled; raises AdminUsageError for an empty, long or secret-bearing one."""
    reason = reason.strip()
    if not reason:
        raise AdminUsageError("--reason must say why (it is journalled)")
    if len(reason) > MAX_REASON:
        raise AdminUsageError(f"--reason is {len(reason)} characters; at most {MAX_REASON}")
    kind = lazy.secrets().find_secret(reason)
    if kind is not None:
        # The kind, never the value: this line may end up in a terminal log.
        raise AdminUsageError(f"--reason looks like it carries a secret ({kind}); the journal keeps it forever")
    return reason


def adjudicate(data_dir: Path, candidate_id: str, accept: bool, reason: str, now: int) -> dict[str, Any]:
    from engram_memory.store.core.engine import Engine

    reason = check_reason(reason)
    engine = Engine.open(EngineSettings(data_dir=data_dir, semantic=False))
    try:
        return adjudicate_with(engine, str(data_dir), candidate_id, accept, reason, now)
    finally:
        engine.close()


def adjudicate_with(engine: Any, where: str, candidate_id: str, accept: bool, reason: str,
                    now: int) -> dict[str, Any]:
    """The decision on an open engine: the data dir's own (DuckDB: the record indexed here), or an
    admin node of a shared store, whose serving nodes index it when they catch up from the journal."""
    reason = check_reason(reason)
    with engine._rw.write():  # the engine's write lock: one writer, as every mutation
        try:
            result, admitted = engine.lifecycle.adjudicate(candidate_id, accept, reason, now)
        except LookupError:
            raise AdminUsageError(f"no candidate {candidate_id} in the store at {where}") from None
        except ValueError as exc:
            raise AdminRefusal(NOT_ADJUDICABLE, str(exc)) from None
        if admitted is not None:
            engine.operator_admitted(admitted.scope_ref, admitted.record, admitted.cursor)
    event = result["event"]
    return {"candidate_id": candidate_id, "scope_ref": result["scope_ref"], "decision": "accept" if accept
            else "reject", "status": result["outcome"]["status"], "record_id": result["outcome"].get("record_id"),
            "cursor": int(event["cursor"]), "event_id": event["event_id"], "event_hash": event["event_hash"],
            "reason": reason}
