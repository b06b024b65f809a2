"""``engram-memory admin expire|adjudicate|history|candidates``: retention, the candidates held for
adjudication, and a scope's journal and pending candidates (never content).

On a PostgreSQL store (``--store URL --master-key-file FILE``) each runs against the live store: it
is shared and transactional (history and candidates need no master key: nothing is decrypted).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from engram_memory.server.admin.options import (
    DataDir,
    JsonOut,
    PgKeyFile,
    PgStore,
    Scope,
    _busy,
    _closed_store,
    _emit,
    _fail,
    _now,
    _outcomes,
    _pair,
    _pg_outcomes,
    _pg_scope,
    _postgres,
    _scope_ref,
    _short,
    _table,
    _target,
)

commands = typer.Typer()  # registered on admin_app by server/admin/app.py


# -- lifecycle maintenance -----------------------------------------------------------------------


@commands.command("expire")
def expire_cmd(data_dir: DataDir = None, scope: Scope = None, store: PgStore = None,
               master_key_file: PgKeyFile = None, json_out: JsonOut = False) -> None:
    """Expire every record past its retention.expires_at now (journalled), in one scope or all.

    With --store: on the live PostgreSQL store; each serving node drops the expired records from
    its projections when it catches up from the journal (at once, or before its next read)."""
    scope_ref = _scope_ref(scope)
    pg = _postgres(store, master_key_file, data_dir)
    from engram_memory.store.host.expire import expire, expire_with

    if pg is not None:
        assert pg.key_file is not None
        _pg_scope(pg, scope_ref)
        from engram_memory.store.core.admin_node import admin_engine

        with _pg_outcomes(), _busy("expiring due records"), admin_engine(pg.url, pg.key_file) as engine:
            done = expire_with(engine, scope_ref, _now())
    else:
        target = _target(data_dir)
        _closed_store(target, scope_ref)
        with _busy("expiring due records"):
            done = expire(target, scope_ref, _now())
    data = {"expired": {_pair(s): ids for s, ids in done.items()}, "total": sum(len(v) for v in done.values())}
    _emit(json_out, data, lambda: _table(
        f"expired {data['total']} record(s)", ["scope", "expired", "record ids"],
        [[_pair(s), len(ids), " ".join(ids)] for s, ids in done.items()]))


@commands.command("adjudicate")
def adjudicate_cmd(
    candidate: Annotated[str, typer.Option("--candidate", help="The candidate id held for adjudication.")],
    reason: Annotated[str, typer.Option("--reason", help="Why (journalled; screened for secrets).")],
    accept: Annotated[bool | None, typer.Option("--accept/--reject", help="The decision.",
                                                show_default=False)] = None,
    data_dir: DataDir = None,
    store: PgStore = None,
    master_key_file: PgKeyFile = None,
    json_out: JsonOut = False,
) -> None:
    """Accept or reject a candidate whose admission answered pending_adjudication.

    With --store: on the live PostgreSQL store; each serving node indexes an accepted record when it
    catches up from the journal (and embeds it once, for every node, if the admin node did not)."""
    if accept is None:
        raise _fail("say --accept or --reject")
    pg = _postgres(store, master_key_file, data_dir)
    from engram_memory.store.host.adjudicate import adjudicate, adjudicate_with, check_reason

    with _outcomes():
        check_reason(reason)  # before the store is touched
    if pg is not None:
        assert pg.key_file is not None
        from engram_memory.store.core.admin_node import admin_engine

        with _pg_outcomes(), admin_engine(pg.url, pg.key_file) as engine:
            result = adjudicate_with(engine, "the PostgreSQL store", candidate, accept, reason, _now())
    else:
        target = _target(data_dir)
        with _outcomes():
            _closed_store(target)
            result = adjudicate(target, candidate, accept, reason, _now())
    _emit(json_out, {**result, "scope": _pair(result["scope_ref"])}, lambda: _table(
        f"candidate {candidate}: {result['status']}", ["field", "value"],
        [[k, v] for k, v in result.items() if k != "scope_ref"] + [["scope", _pair(result["scope_ref"])]]))


# -- reading ------------------------------------------------------------------------------------


def _one_scope(scope: str, data_dir: Path | None) -> tuple[str, Path]:
    """The scope a per-scope listing reads, and its store (closed: no server holds it)."""
    scope_ref = _scope_ref(scope)
    assert scope_ref is not None
    target = _target(data_dir)
    _closed_store(target, scope_ref)
    return scope_ref, target


def _listing(scope: str, data_dir: Path | None, store: str | None, key_file: Path | None,
             read: Callable[[Any, str], list[dict[str, Any]]],
             read_dir: Callable[[Path, str], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """A per-scope listing, of the DuckDB store of the data dir or of a PostgreSQL store (its
    master key is optional here: nothing is decrypted; when given, it is checked)."""
    pg = _postgres(store, key_file, data_dir, need_key=False)
    if pg is None:
        ref, target = _one_scope(scope, data_dir)
        return read_dir(target, ref)
    scope_ref = _scope_ref(scope)
    assert scope_ref is not None
    _pg_scope(pg, scope_ref)
    from engram_memory.store.opening import shared

    with _pg_outcomes():
        inspector = shared(pg.url).inspector(pg.url, pg.key, pg.key_file)
        try:
            return read(inspector, scope_ref)
        finally:
            inspector.close()


@commands.command("history")
def history_cmd(
    scope: Annotated[str, typer.Option("--scope", help="The scope, as TENANT/WORKSPACE.")],
    data_dir: DataDir = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Only the last N events.")] = None,
    store: PgStore = None,
    master_key_file: PgKeyFile = None,
    json_out: JsonOut = False,
) -> None:
    """A scope's journal: cursors, operations, ids, hashes and each event's own instant (never content).

    With --store: the PostgreSQL store's journal, live (--master-key-file optional: nothing is decrypted)."""
    from engram_memory.store.host.history import journal, journal_listing

    events = _listing(scope, data_dir, store, master_key_file,
                      lambda inspector, ref: journal_listing(inspector.journal_tail(ref, limit)),
                      lambda target, ref: journal(target, ref, limit))
    _emit(json_out, {"scope": scope, "events": events}, lambda: _table(
        f"journal of {scope} ({len(events)} event(s))",
        ["cursor", "operation", "event_id", "at", "to_state", "reason", "event_hash"],
        [[e["cursor"], e["operation"], _short(e["event_id"], 28), e["at"], e["to_state"], e["reason"],
          _short(e["event_hash"])] for e in events]))


@commands.command("candidates")
def candidates_cmd(
    scope: Annotated[str, typer.Option("--scope", help="The scope, as TENANT/WORKSPACE.")],
    data_dir: DataDir = None,
    store: PgStore = None,
    master_key_file: PgKeyFile = None,
    json_out: JsonOut = False,
) -> None:
    """A scope's pending candidates: ids, principals, cursors, times, digests (never content).

    With --store: the PostgreSQL store's, live (--master-key-file optional: nothing is decrypted)."""
    from engram_memory.store.host.history import candidate_listing, pending_candidates

    rows = _listing(scope, data_dir, store, master_key_file,
                    lambda inspector, ref: candidate_listing(inspector.pending_candidates(ref)), pending_candidates)
    _emit(json_out, {"scope": scope, "candidates": rows}, lambda: _table(
        f"pending candidates of {scope} ({len(rows)})",
        ["candidate_id", "principal", "state", "created_cursor", "recorded_at", "held", "payload_digest"],
        [[r["candidate_id"], r["principal"], r["state"], r["created_cursor"], r["recorded_at"],
          "adjudication" if r["held_for_adjudication"] else "", _short(r["payload_digest"])] for r in rows]))
