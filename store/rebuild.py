"""Rebuild every projection (or one scope's) from DuckDB, optionally verifying against the live ones.

Embeddings are read back from DuckDB (keyed by record and model digest), so a rebuild never
re-embeds an unchanged record. ``verify`` builds aside, compares the rebuilt projections
with the live ones on probe queries, reports any difference, then swaps them in.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.progress import Progress

from engram_memory.models.settings import EngineSettings
from engram_memory.retrieval.lexical import LexicalDoc
from engram_memory.retrieval.projections import Projections
from engram_memory.store.engine import Engine
from engram_memory.store.lifecycle import lexical_fields

PROBES = 200


@dataclass
class ScopeReport:
    scope_dir: str
    records: int
    vectors: int
    differences: list[str] = field(default_factory=list)


@dataclass
class RebuildReport:
    scopes: list[ScopeReport]

    @property
    def differences(self) -> int:
        return sum(len(s.differences) for s in self.scopes)

    def as_dict(self) -> dict[str, Any]:
        return {"scopes": [s.__dict__ for s in self.scopes], "differences": self.differences}


def _probe_queries(records: list[dict[str, Any]]) -> list[str]:
    step = max(1, len(records) // PROBES)
    probes = []
    for record in records[::step][:PROBES]:
        words = " ".join(c["text"] for c in record["components"]).split()
        probes.append(" ".join(words[:8]) or record["record_id"])
    return probes


def _compare(live: Projections, built: Projections, scope_ref: str, records: list[dict[str, Any]],
             vectors: tuple[list[str], np.ndarray] | None) -> list[str]:
    diffs = []
    live_lex, new_lex = live.lexical(scope_ref), built.lexical(scope_ref)
    if live_lex.count() != new_lex.count():
        diffs.append(f"lexical document count {live_lex.count()} != rebuilt {new_lex.count()}")
    for query in _probe_queries(records):
        if live_lex.search(query, 10) != new_lex.search(query, 10):
            diffs.append("lexical ranking differs for a probe query")
            break
    live_vec, new_vec = live.vectors(scope_ref), built.vectors(scope_ref)
    if live_vec.count() != new_vec.count():
        diffs.append(f"vector count {live_vec.count()} != rebuilt {new_vec.count()}")
    if vectors is not None and vectors[0]:
        step = max(1, len(vectors[0]) // PROBES)
        for row in vectors[1][::step][:PROBES]:
            if live_vec.search(row, 10) != new_vec.search(row, 10):
                diffs.append("vector ranking differs for a probe vector")
                break
    return diffs


def rebuild_index(data_dir: Path, scope_ref: str | None = None, verify: bool = False,
                  model_path: Path | None = None, show_progress: bool = True, semantic: bool = True
                  ) -> RebuildReport:
    """Raises StoreBusyError when a server owns the data directory."""
    engine = Engine.open(EngineSettings(data_dir=data_dir, model_path=model_path, semantic=semantic))
    try:
        if engine.embedder is not None:
            engine.wait_semantic(600)  # records admitted before the model was ready get embedded now
        scopes = [scope_ref] if scope_ref else engine.scopes()
        reports = []
        with Progress(disable=not show_progress, transient=False) as progress:
            task = progress.add_task("rebuilding projections", total=len(scopes))
            for scope in scopes:
                records = engine.live_records(scope)
                vectors = engine.stored_vectors(scope)
                docs = [LexicalDoc(r["record_id"], lexical_fields(r)) for r in records]
                cursor = engine.projection_cursor(scope)
                report = ScopeReport(engine.projections.scope_dir(scope).name, len(records),
                                     len(vectors[0]) if vectors else 0)
                if verify:
                    aside = data_dir / "projections.rebuild"
                    shutil.rmtree(aside, ignore_errors=True)
                    built = Projections(aside, hnsw_threshold=engine.projections.hnsw_threshold,
                                        lexical_config=engine.projections.lexical_config)
                    built.rebuild(scope, docs, vectors, cursor)
                    report.differences = _compare(engine.projections, built, scope, records, vectors)
                    built.close()
                    engine.projections.replace_scope(scope, built.scope_dir(scope))
                    shutil.rmtree(aside, ignore_errors=True)
                else:
                    engine.projections.rebuild(scope, docs, vectors, cursor)
                reports.append(report)
                progress.advance(task)
        return RebuildReport(reports)
    finally:
        engine.close()
