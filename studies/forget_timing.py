"""Time the forget path on one scope and scan the data directory afterwards.

    python -m studies.forget_timing --records 1000 --forgets 20 [--json]

Builds a fresh store (one scope, ``--records`` admitted records, embedded when ``--semantic``),
then forgets ``--forgets`` records one at a time through the engine, timing each call and its
stages (the lifecycle commit, the lexical purge, the vector purge and save). Finally it closes the
engine (DuckDB checkpoints) and runs the forensic scans of checks/forensic.py for the forgotten
records' text and vectors: files and bytes read, seconds, and what was found (must be nothing).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import hashlib  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated, Any  # noqa: E402

import numpy as np  # noqa: E402
import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402
from rich.table import Table  # noqa: E402

from engram_memory.checks.forensic import content_needles, orphan_keys, scan_duckdb, scan_files  # noqa: E402
from engram_memory.eval.bench_parts import pcts  # noqa: E402

WORDS = ("release train backup replica schema cache index budget rollout pager tenant quota audit "
         "latency cluster vendor invoice migration contract sprint roadmap incident deploy").split()


def record_text(i: int, rng: random.Random) -> str:
    # Each forgotten-to-be record carries two tokens no other record has (its needles).
    body = " ".join(rng.choice(WORDS) for _ in range(18))
    return f"Note {i}: {body}. Marker zq{i:05d}xv vl{i:05d}mr."


T0 = 1_780_000_000_000  # a fixed store clock: 2026-05-28T20:26:40.000Z
PURPOSE = "purpose:forget-timing"


def ctx() -> Any:
    from engram_memory.models.context import HostContext

    return HostContext(tenant="acme", workspace="main", principal="alice", agent_id="agent-1",
                       purpose_ref=PURPOSE)


def capture_args(text: str, key: str) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    at = T0 - 86_400_000
    return {
        "idempotency_key": key,
        "payload": {
            "schema_version": 2, "purpose_ref": PURPOSE, "valid_time": {"t": at},
            "components": [{"component_id": "c1", "kind": "decision", "text": text, "citation_ids": ["s1"]}],
            "primary_component_id": "c1",
            "primary_event": {"at": at, "type_ref": "event:decided", "citation_id": "s1"},
            "citations": [{"citation_id": "s1", "source_ref": "doc:notes",
                           "locator": {"scheme": "path", "value": "notes.md"}, "content_digest": digest}],
        },
        "evidence": {"evidence_ref": "ev:1", "evidence_digest": digest, "citation_ids": ["s1"]},
    }


@contextmanager
def timed_methods(targets: list[tuple[Any, str]], out: dict[str, list[float]]) -> Iterator[None]:
    """Wrap ``cls.method`` so each call's duration lands in ``out[method label]``."""
    saved = []
    for cls, name in targets:
        original = getattr(cls, name)
        label = f"{cls.__name__}.{name}"

        def wrapper(*args: Any, _orig: Callable[..., Any] = original, _label: str = label, **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return _orig(*args, **kw)
            finally:
                out[_label].append(time.perf_counter() - start)

        saved.append((cls, name, original))
        setattr(cls, name, wrapper)
    try:
        yield
    finally:
        for cls, name, original in saved:
            setattr(cls, name, original)


def run(records: int, forgets: int, semantic: bool, hnsw_threshold: int | None, data_dir: Path,
        progress: bool) -> dict[str, Any]:
    from engram_memory.models.settings import EngineSettings
    from engram_memory.models.tools import parse_input

    def typed(tool: str, args: dict[str, Any]) -> Any:  # the validated input model the engine takes
        return parse_input(tool, args)
    from engram_memory.retrieval.lexical import LexicalIndex
    from engram_memory.retrieval.vectors import VectorIndex
    from engram_memory.store.core.engine import Engine, embedding_text
    from engram_memory.store.core.lifecycle import Lifecycle

    settings: dict[str, Any] = {"data_dir": data_dir, "semantic": semantic}
    if hnsw_threshold is not None:
        settings["hnsw_threshold"] = hnsw_threshold
    engine = Engine.open(EngineSettings(**settings), clock=lambda: T0)
    rng = random.Random(7)
    texts = [record_text(i, rng) for i in range(records)]
    ids: list[str] = []
    with Progress(console=Console(stderr=True), disable=not progress, transient=True) as bar:
        task = bar.add_task("admitting", total=records)
        with engine.batch():
            for i, text in enumerate(texts):
                cap = engine.capture(ctx(), typed("capture", capture_args(text, key=f"capture-key-{i:08d}")))
                admit = {"candidate_id": cap.candidate_id, "idempotency_key": f"admit-key-{i:08d}"}
                out = engine.request_admission(ctx(), typed("request_admission", admit))
                ids.append(str(out.outcome.record_id))
                bar.advance(task)
        if semantic:
            bar.add_task("embedding (model load and backfill)", total=None)
            if not engine.wait_semantic(900):
                raise RuntimeError("the semantic channel never became ready")
    scope = ctx().scope_ref
    doomed = sorted(rng.sample(range(records), forgets))
    needles: dict[str, bytes] = {}
    vectors = engine.stored_vectors(scope)
    for i in doomed:
        vec = None
        if vectors is not None:
            vec = vectors[1][vectors[0].index(ids[i])]
            record = next(r for r in engine.live_records(scope) if r["record_id"] == ids[i])
            assert embedding_text(record) == texts[i]
        needles.update(content_needles(f"r{i}", texts[i], [f"zq{i:05d}xv", f"vl{i:05d}mr"], vec))
    engine.projections.vectors(scope).save()
    stages: dict[str, list[float]] = defaultdict(list)
    calls: list[float] = []
    answers: dict[str, int] = defaultdict(int)
    targets = [(Lifecycle, "forget"), (LexicalIndex, "delete"), (VectorIndex, "delete"), (VectorIndex, "save")]
    with timed_methods(targets, stages), Progress(console=Console(stderr=True), disable=not progress,
                                                  transient=True) as bar:
        task = bar.add_task("forgetting", total=forgets)
        for n, i in enumerate(doomed):
            start = time.perf_counter()
            args = {"record_id": ids[i], "idempotency_key": f"forget-key-{n:08d}", "reason_ref": "reason:timing"}
            value = engine.forget(ctx(), typed("forget", args))
            calls.append(time.perf_counter() - start)
            answers[value.projection_invalidation] += 1
            bar.advance(task)
    start = time.perf_counter()
    engine.close()
    close_s = time.perf_counter() - start
    files = scan_files(data_dir, needles)
    store = scan_duckdb(data_dir, needles)
    return {
        "records": records,
        "forgets": forgets,
        "semantic": semantic,
        "answers": dict(answers),
        "forget_ms": pcts(calls),
        "stages_ms": {k: pcts(v) for k, v in sorted(stages.items())},
        "close_s": close_s,
        "scan": {"files": files.files, "bytes": files.size, "files_seconds": files.seconds,
                 "duckdb_values": store.values, "duckdb_seconds": store.seconds,
                 "needles": len(needles), "found": {**files.hits, **store.hits},
                 "orphan_keys": len(orphan_keys(data_dir))},
        "vector_rows": int(vectors[1].shape[0]) if vectors is not None else 0,
        "vector_bytes": int(np.asarray(vectors[1]).nbytes) if vectors is not None else 0,
    }


def main(
    records: Annotated[int, typer.Option("--records", min=2, help="Records admitted into the scope.")] = 1000,
    forgets: Annotated[int, typer.Option("--forgets", min=1, help="Records forgotten, one call each.")] = 20,
    semantic: Annotated[bool, typer.Option("--semantic/--no-semantic", help="Embed (vectors on disk).")] = True,
    hnsw_threshold: Annotated[int | None, typer.Option("--hnsw-threshold", min=1,
                                                       help="Vectors from which search uses HNSW.")] = None,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", file_okay=False,
                                                  help="Store directory (default: a temp dir).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Progress bars on stderr.")] = True,
) -> None:
    """Time the forget path and scan the data directory for the forgotten content."""
    if forgets > records:
        sys.stderr.write("engram-memory: error: --forgets must not exceed --records\n")
        raise typer.Exit(2)
    if data_dir is not None and data_dir.exists() and any(data_dir.iterdir()):
        sys.stderr.write(f"engram-memory: error: --data-dir {data_dir} is not empty\n")
        raise typer.Exit(2)
    with tempfile.TemporaryDirectory(prefix="engram-forget-") as tmp:
        report = run(records, forgets, semantic, hnsw_threshold, data_dir or Path(tmp) / "data", progress)
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        table = Table(title=f"forget on a scope of {records} records ({forgets} forgets)")
        table.add_column("measure")
        table.add_column("p50 ms", justify="right")
        table.add_column("p95 ms", justify="right")
        table.add_column("mean ms", justify="right")
        for label, p in [("forget (whole call)", report["forget_ms"]), *report["stages_ms"].items()]:
            table.add_row(label, f"{p['p50']:.1f}", f"{p['p95']:.1f}", f"{p['mean']:.1f}")
        Console().print(table)
        scan = report["scan"]
        Console().print(
            f"answers {report['answers']}; close {report['close_s']:.2f} s; scanned {scan['files']} files,"
            f" {scan['bytes']:,} bytes in {scan['files_seconds']:.2f} s and {scan['duckdb_values']:,} DuckDB"
            f" values in {scan['duckdb_seconds']:.2f} s for {scan['needles']} needles: found"
            f" {scan['found'] or 'nothing'}; orphan keys {scan['orphan_keys']}")
    raise typer.Exit(1 if report["scan"]["found"] or report["scan"]["orphan_keys"] else 0)


if __name__ == "__main__":
    typer.run(main)
