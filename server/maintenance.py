"""Host-only maintenance commands (never agent tools): rebuild-index."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from engram_memory.models.context import HostContext


def rebuild_index_cmd(
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="Store directory.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Rebuild only this tenant's workspace (with --workspace).")] = None,
    workspace: Annotated[str | None, typer.Option(help="Workspace of the single scope to rebuild.")] = None,
    verify: Annotated[bool, typer.Option("--verify", help="Build aside, compare with the live projections.")] = False,
    model_path: Annotated[Path | None, typer.Option("--model-path", help="Local embedding model directory.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Rebuild the search projections (Tantivy + vectors) from DuckDB; refuses while a server runs."""
    from engram_memory.server.config import default_data_dir
    from engram_memory.store.db import StoreBusyError
    from engram_memory.store.rebuild import rebuild_index

    scope_ref = None
    if tenant or workspace:
        if not (tenant and workspace):
            sys.stderr.write("engram-memory: error: --tenant and --workspace go together\n")
            raise typer.Exit(2)
        scope_ref = HostContext(tenant, workspace, "host", "host", "purpose:maintenance").scope_ref
    target = data_dir or default_data_dir()
    try:
        report = rebuild_index(target, scope_ref=scope_ref, verify=verify, model_path=model_path)
    except StoreBusyError:
        sys.stderr.write(f"engram-memory: error: data dir {target} is in use by a running server; stop it first\n")
        raise typer.Exit(2) from None
    if json_out:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        for scope in report.scopes:
            status = "identical" if not scope.differences else "; ".join(scope.differences)
            print(f"scope {scope.scope_dir}: {scope.records} records, {scope.vectors} vectors"
                  + (f" — verify: {status}" if verify else ""))
    if verify and report.differences:
        raise typer.Exit(1)
