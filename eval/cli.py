"""``engram-memory eval`` and ``engram-memory bench`` as plain typer command functions.

server/cli.py owns the app and never imports this module: the commands are registered through
the ``engram_memory.commands`` entry point group (pyproject.toml). Their heavy dependencies
(ranx, matplotlib) are the ``eval`` extra; without it the commands say how to install it.
Progress bars and messages go to stderr; stdout stays clean (it is the MCP channel elsewhere).
"""

from __future__ import annotations

import os

# Offline always (set before sentence-transformers can be imported by the engine).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated  # noqa: E402

import typer  # noqa: E402

Opt = typer.Option
EXTRA_MODULES = ("ranx", "matplotlib")


def require_eval_extra() -> None:
    """One clear line and exit 2 when the evaluation extra is not installed."""
    import importlib.util

    missing = [name for name in EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        sys.stderr.write(
            f"engram-memory: error: the evaluation harness needs {', '.join(missing)}; "
            "install it with: pip install 'engram-memory[eval]' (from a clone: pip install -e '.[eval]')\n"
        )
        raise typer.Exit(2)


def _csv(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _weights(value: str | None) -> tuple[float, float] | None:
    if value is None:
        return None
    parts = [float(v) for v in _csv(value)]
    if len(parts) != 2:
        raise typer.BadParameter("--weights takes two numbers: lexical,semantic")
    return parts[0], parts[1]


def eval_cmd(
    dataset: Annotated[Path, Opt("--dataset", help="BEIR collection dir (corpus.jsonl, queries.jsonl, qrels/).",
                                 exists=True, file_okay=False)],
    out: Annotated[Path, Opt("--out", help="Output dir: results.json, report.md, report.png, runs/.")],
    channels: Annotated[str, Opt("--channels", help="Runs to score, comma-separated.")] = "lexical,semantic,hybrid",
    fusion: Annotated[str | None, Opt("--fusion", help="rrf, dbsf or convex (default: the engine's).")] = None,
    limit_docs: Annotated[int | None, Opt("--limit-docs", min=1,
                                          help="Judged-first subset of N docs; keeps fully judged queries.")] = None,
    peer: Annotated[str | None, Opt("--peer", help="Also run a peer side by side: lancedb.")] = None,
    rrf_k: Annotated[int | None, Opt("--rrf-k", min=1, help="RRF constant (default: the engine's).")] = None,
    weights: Annotated[str | None, Opt("--weights", help="Score-fusion weights lexical,semantic.")] = None,
    cache_dir: Annotated[Path | None, Opt("--cache-dir",
                                          help="Store cache root (default OUT/store); keyed by corpus digest.")] = None,
    mapping: Annotated[str, Opt("--mapping", help="Doc -> capture: single (title+text) or split.")] = "single",
    progress: Annotated[bool, Opt("--progress/--no-progress", help="Progress bars on stderr.")] = True,
    threads: Annotated[int | None, Opt("--threads", min=1, help="torch intra-op threads (default: torch's).")] = None,
    max_queries: Annotated[int | None, Opt("--max-queries", min=1,
                                           help="Score only the first N judged queries (CI smoke).")] = None,
    latency: Annotated[bool, Opt("--latency/--no-latency", help="Also time one limit-10 search per query.")] = True,
) -> None:
    """Score lexical, semantic and hybrid search on a BEIR collection through the real engine."""
    require_eval_extra()
    from engram_memory.eval.harness import run_eval

    try:
        results = run_eval(dataset, out, channels=_csv(channels), fusion=fusion, rrf_k=rrf_k,
                           weights=_weights(weights), limit_docs=limit_docs, peer=peer, cache_dir=cache_dir,
                           mapping=mapping, progress=progress, threads=threads,
                           max_queries=max_queries, latency=latency)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    for name, scores in results["runs"].items():
        sys.stderr.write(f"{results['dataset']} {name:>8}: " + "  ".join(f"{k} {v:.4f}" for k, v in scores.items())
                         + "\n")
    sys.stderr.write(f"wrote {Path(out) / 'results.json'}\n")


def bench_cmd(
    out: Annotated[Path, Opt("--out", help="Output dir: bench.json, bench.md (and mcp-server-<size>.stderr, "
                             "profile-<size>.txt).", file_okay=False)],
    sizes: Annotated[str, Opt("--sizes", help="Store sizes, comma-separated.")] = "1000,10000,100000",
    dataset: Annotated[Path | None, Opt("--dataset", help="BEIR collection for record text and queries "
                                        "(default: synthetic Zipf text).", exists=True, file_okay=False)] = None,
    queries: Annotated[int, Opt("--queries", min=1, help="Queries per latency cell.")] = 200,
    ops_sample: Annotated[int, Opt("--ops-sample", min=1, help="Single captures+admissions timed per size.")] = 100,
    peer: Annotated[str | None, Opt("--peer", help="Also bench a peer: lancedb (needs the bench extra); "
                                    "without it the LanceDB ratios are reported as not measured.")] = None,
    mcp: Annotated[bool, Opt("--mcp/--no-mcp", help="Per size, also time searches through the real stdio "
                             "server (MCP SDK client) for the MCP ratio.")] = True,
    profile: Annotated[int, Opt("--profile", min=0, metavar="N",
                                help="cProfile N in-process hybrid searches per size into "
                                "OUT/profile-<size>.txt (0: off).")] = 0,
    progress: Annotated[bool, Opt("--progress/--no-progress", help="Progress bars on stderr.")] = True,
    threads: Annotated[int | None, Opt("--threads", min=1, help="torch intra-op threads (default: torch's); "
                                       "the MCP server gets the same via OMP_NUM_THREADS.")] = None,
    resume: Annotated[bool, Opt("--resume", help="Keep OUT/bench-store from an earlier run and grow it on "
                                "(measure a new build at 100k without re-ingesting).")] = False,
) -> None:
    """Latency, throughput, rebuild time and memory of the real engine at several store sizes.

    Per size it also prints the target ratios, pass/fail: vs LanceDB, vs the sum of parts, 4 vs 1 searchers, MCP.
    """
    require_eval_extra()
    try:
        size_list = sorted({int(s) for s in _csv(sizes)})
    except ValueError as exc:
        raise typer.BadParameter("--sizes takes integers, e.g. 1000,10000") from exc
    if not size_list or size_list[0] < 1:
        raise typer.BadParameter("--sizes needs positive integers")
    if peer not in (None, "lancedb"):
        raise typer.BadParameter("--peer supports: lancedb")
    if dataset is not None and not ((dataset / "corpus.jsonl").is_file() and (dataset / "queries.jsonl").is_file()
                                    and (dataset / "qrels" / "test.tsv").is_file()):
        _bench_error(f"--dataset {dataset} is not a BEIR collection (needs corpus.jsonl, queries.jsonl, "
                     "qrels/test.tsv)")
    if peer == "lancedb":
        from engram_memory.eval import peer_lancedb

        why = peer_lancedb.unavailable()
        if why:
            _bench_error(f"--peer lancedb: {why}")
    if resume and not (out / "bench-store").is_dir():
        _bench_error(f"--resume: no store to resume at {out / 'bench-store'} (run once without --resume)")

    from engram_memory.eval.bench import run_bench
    from engram_memory.store.engine import StoreBusyError

    try:
        run_bench(out, size_list, dataset=dataset, n_queries=queries, ops_sample=ops_sample, peer=peer,
                  progress=progress, threads=threads, resume=resume, mcp=mcp, profile=profile)
    except StoreBusyError as exc:
        _bench_error(f"{exc} (stop the server using it, or pick another --out)")
    except KeyboardInterrupt:
        sys.stderr.write(f"engram-memory: bench interrupted; sizes finished so far are in {Path(out) / 'bench.json'}\n")
        raise typer.Exit(130) from None
    sys.stderr.write(f"wrote {Path(out) / 'bench.json'} and bench.md\n")


def _bench_error(message: str) -> None:
    sys.stderr.write(f"engram-memory: error: {message}\n")
    raise typer.Exit(2)
