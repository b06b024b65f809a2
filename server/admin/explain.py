"""``engram-memory admin explain`` and ``admin check-receipt``: receipts anyone can check.

explain re-derives a search's rank receipt from the store as of the receipt's cursor and says
whether it matches (exit 0, a short table) or where it differs (exit 1, one line per difference,
then RECEIPT_MISMATCH). check-receipt needs no store: it recomputes the receipt's own digests
from its content (exit 1 naming each field that disagrees). The logic is store/host/explain.py's.
"""

from __future__ import annotations

import json
import sys
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
    _check_model_path,
    _closed_store,
    _emit,
    _fail,
    _outcomes,
    _pair,
    _pg_outcomes,
    _postgres,
    _refuse,
    _scope_ref,
    _short,
    _table,
    _target,
)
from engram_memory.store.core.refusals import RECEIPT_MISMATCH

commands = typer.Typer()  # registered on admin_app by server/admin/app.py

ReceiptFile = Annotated[Path, typer.Option(
    "--receipt", help="A search response (the tool's whole value, or its envelope) or just its rank_receipt, as JSON.")]
Query = Annotated[str | None, typer.Option(
    "--query", help="The search's query, when the receipt file does not carry it (checked against request_digest).")]
PurposeRef = Annotated[str | None, typer.Option(
    "--purpose-ref", help="The search's purpose_ref (when not in the file).")]
Limit = Annotated[int | None, typer.Option("--limit", help="The search's limit, if it gave one.")]
MaxPacketBytes = Annotated[int | None, typer.Option(
    "--max-packet-bytes", help="The search's max_packet_bytes, if it gave one.")]
MinimumChannels = Annotated[str | None, typer.Option(
    "--minimum-channels",
    help="The search's capability_policy.minimum_channels, if it gave one (lexical | lexical_and_semantic).")]


def _given(query: str | None, purpose_ref: str | None, limit: int | None, max_packet_bytes: int | None,
           minimum_channels: str | None) -> dict[str, Any]:
    given: dict[str, Any] = {"query": query, "purpose_ref": purpose_ref, "limit": limit,
                             "max_packet_bytes": max_packet_bytes}
    if minimum_channels is not None:
        given["capability_policy"] = {"minimum_channels": minimum_channels, "network": "forbid"}
    return given


def _settings(config: Path | None, model_path: Path | None, **where: Any) -> Any:
    """The engine settings the server ranked with (its config file and ENGRAM_* variables, as serve
    reads them), on the store named here, without loading the model (explain loads it if needed)."""
    from pydantic import ValidationError

    from engram_memory.models.settings import EngineSettings
    from engram_memory.server.config import ConfigError, load_config

    try:
        engine = load_config({}, config).engine_settings().model_dump()
        engine.update(where, semantic=False)
        if model_path is not None:
            engine["model_path"] = model_path
        return EngineSettings.model_validate(engine)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    except ValidationError as exc:
        raise _fail(f"these settings do not validate: {exc.errors(include_url=False, include_input=False)[0]['msg']}"
                    ) from None


def _differ(json_out: bool, data: dict[str, Any], lines: list[str], what: str) -> typer.Exit:
    """Exit 1: the differences, one line each (stdout; --json: in the document), then the code."""
    if json_out:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        for line in lines:
            print(f"differs: {line}")
        sys.stdout.flush()
    return _refuse(RECEIPT_MISMATCH, f"{what} ({len(lines)} difference(s))")


@commands.command("explain")
def explain_cmd(
    receipt: ReceiptFile,
    data_dir: DataDir = None,
    scope: Scope = None,
    query: Query = None,
    purpose_ref: PurposeRef = None,
    limit: Limit = None,
    max_packet_bytes: MaxPacketBytes = None,
    minimum_channels: MinimumChannels = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="The server's TOML config file: the ranking settings it used (fusion, floor, rerank,"
        " model, ...). ENGRAM_* variables apply as for serve.")] = None,
    model_path: Annotated[Path | None, typer.Option("--model-path", help="The embedding model the server used"
                                                    " (default: the config's, else the packaged one).")] = None,
    store: PgStore = None,
    master_key_file: PgKeyFile = None,
    json_out: JsonOut = False,
) -> None:
    """Re-derive a search's rank receipt from the store as of its cursor, and compare.

    The scope's records current at the receipt's system_as_of are replayed from the journal, their
    projections rebuilt in a temporary directory from the stored embeddings (only the query is
    embedded, and only when the semantic channel ranked), and the search path run over them at the
    receipt's instant. A whole response's packets are held to the receipt first (as check-receipt
    does). Exit 0 when every id, score and digest matches; exit 1 (RECEIPT_MISMATCH)
    with one line per difference -- also when a record the receipt names has been forgotten since
    (its id only). The scope is inferred from the ranked records; name it with --scope otherwise."""
    from engram_memory.store.host.explain import explain_on, read_receipt, search_arguments

    scope_ref = _scope_ref(scope)
    pg = _postgres(store, master_key_file, data_dir)
    if model_path is not None:
        problem = _check_model_path(model_path)
        if problem:
            raise _fail(problem)
    with _outcomes():
        parsed = read_receipt(receipt)
        arguments = search_arguments(parsed, **_given(query, purpose_ref, limit, max_packet_bytes, minimum_channels))
    from engram_memory.store.core.engine import Engine

    if pg is not None:
        assert pg.key_file is not None
        import tempfile

        with _pg_outcomes(), _busy("re-deriving the ranking"), \
                tempfile.TemporaryDirectory(prefix="engram-explain-") as node:
            # An admin node of its own (as store/core/admin_node.py's), with the server's settings.
            engine = Engine.open(_settings(config, model_path, data_dir=Path(node), store=pg.url,
                                           master_key_file=pg.key_file))
            try:
                result = explain_on(engine, parsed, arguments, scope_ref)
            finally:
                engine.close()
    else:
        target = _target(data_dir)
        settings = _settings(config, model_path, data_dir=target, store=None, master_key_file=None)
        with _outcomes():
            _closed_store(target, scope_ref)
            with _busy("re-deriving the ranking"):
                engine = Engine.open(settings)
                try:
                    result = explain_on(engine, parsed, arguments, scope_ref)
                finally:
                    engine.close()
    data = {**result.as_dict(), "scope": _pair(result.scope_ref)}
    data.pop("scope_ref")
    if not result.matched:
        raise _differ(json_out, data, result.differences, "the receipt does not re-derive")
    if json_out:
        print(json.dumps(data, indent=2, sort_keys=True))
        return
    from rich.console import Console

    Console(width=None if sys.stdout.isatty() else 200).print(_table(
        f"receipt re-derived in {_pair(result.scope_ref)} as of cursor {result.cursor}: it matches",
        ["rank", "record_id", "score", "re-derived"],
        [[row["rank"], _short(row["record_id"], 24), row["score"], row["rederived_score"]] for row in result.rows]
        or [["", "(no record ranked)", "", ""]]))


@commands.command("check-receipt")
def check_receipt_cmd(
    receipt: ReceiptFile,
    query: Query = None,
    purpose_ref: PurposeRef = None,
    limit: Limit = None,
    max_packet_bytes: MaxPacketBytes = None,
    minimum_channels: MinimumChannels = None,
    json_out: JsonOut = False,
) -> None:
    """Check a receipt without any store: its own digests recomputed from its content.

    receipt_digest always; with the whole response, response_digest and the packets against the
    ranked entries; ordered_ids_digest (and candidate_ids_digest) when the page shows the whole
    ranking; request_digest when the query is given (in the file or with --query and the other
    options). Ranks, and each channel's ranks against its scores, must be consistent. Exit 0 when
    everything agrees; exit 1 (RECEIPT_MISMATCH) with one line per field that does not."""
    from engram_memory.store.host.explain import check_receipt, given_arguments, read_receipt

    with _outcomes():
        parsed = read_receipt(receipt)
        # With the query, request_digest is checked too (a mismatch is then a field that differs).
        arguments = None
        if query is not None or "query" in parsed.arguments:
            arguments = given_arguments(parsed, **_given(query, purpose_ref, limit, max_packet_bytes,
                                                          minimum_channels))
    result = check_receipt(parsed, arguments)
    problems, checked, r = result.problems, result.checked, parsed.rank_receipt
    data = {"consistent": not problems, "problems": problems, "checked": checked,
            "receipt_digest": r["receipt_digest"], "system_as_of": r["system_as_of"], "ranked": len(r["ranked"])}
    if problems:
        raise _differ(json_out, data, problems, "the receipt is not consistent with its own content")
    _emit(json_out, data, lambda: _table(
        "receipt consistent with its own content", ["field", "value"],
        [["checked", ", ".join(checked)], ["receipt_digest", r["receipt_digest"]],
         ["system_as_of", r["system_as_of"]], ["ranked", len(r["ranked"])]]))
