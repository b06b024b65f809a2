"""``engram-memory eval`` and ``engram-memory bench`` as plain typer command functions.

server/cli.py owns the app and never imports this module: the commands are registered through
the ``engram_memory.commands`` entry point group (pyproject.toml). Their heavy dependencies
(ranx, matplotlib) are the ``eval`` extra; without it the commands say how to install it.
Progress bars and messages go to stderr; ``eval`` prints its result table and the paths of its
report on stdout once the run is done.

Every option is checked before any work (eval/options.py, eval/beir.py): a bad value exits 2 with
one ``engram-memory: error: ...`` line, no traceback, nothing created.
"""

from __future__ import annotations

import os

# Offline always (set before sentence-transformers can be imported by the engine).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated, Any, NoReturn  # noqa: E402

import typer  # noqa: E402

from engram_memory.eval import options  # noqa: E402
from engram_memory.eval.beir import (  # noqa: E402
    Collection,
    CollectionError,
    check_layout,
    collection_folders,
    load_collection,
)
from engram_memory.eval.options import OptionError  # noqa: E402
from engram_memory.models.settings import parse_bytes  # noqa: E402

Opt = typer.Option
EXTRA_MODULES = ("ranx", "matplotlib")


def fail(message: str) -> NoReturn:
    """The one line a refused command prints (stderr), and exit 2: nothing was started."""
    sys.stderr.write(f"engram-memory: error: {message}\n")
    sys.stderr.flush()
    raise typer.Exit(2)


def require_eval_extra() -> None:
    """One clear line and exit 2 when the evaluation extra is not installed."""
    import importlib.util

    missing = [name for name in EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        fail(f"the evaluation harness needs {', '.join(missing)}; install it with: pip install "
             "'engram-memory[eval]' (from a clone: pip install -e '.[eval]')")


def say(command: str, message: str) -> None:
    """A status line on stderr: what the command is doing while there is no bar to show."""
    sys.stderr.write(f"{command}: {message}\n")
    sys.stderr.flush()


def _make_dir(option: str, path: Path) -> None:
    """The first thing a checked command creates; a file system that refuses it is still one line."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"{option} {path}: cannot create it ({exc.strerror or exc})")


def _collection(dataset: Path, limit_docs: int | None) -> Collection:
    """The collection read and checked (one line per problem); its warnings are said, not fatal."""
    col = load_collection(dataset, limit_docs)
    if not col.queries:
        fail(f"--limit-docs {limit_docs} keeps no fully judged query of {dataset} (no query has all its "
             f"relevant documents among the {len(col.docs):,} kept); raise it")
    return col


# Integer options are taken as text and checked in the command (eval/options.py): click's own
# conversion errors are a multi-line box, and every refusal here is one line.
def eval_cmd(
    dataset: Annotated[Path | None, Opt("--dataset", show_default=False,
                                        help="BEIR collection folder: corpus.jsonl, queries.jsonl, qrels/test.tsv "
                                        "(a clone has eval/sample); or a folder whose sub-folders are collections "
                                        "(each is scored in its own scope, plus the mean). Required.")] = None,
    out: Annotated[Path | None, Opt("--out", show_default=False,
                                    help="Output dir: results.json, report.md, report.png, runs/ (a folder of "
                                    "collections: OUT/<name>/ each, and the summary). Required.")] = None,
    channels: Annotated[str, Opt("--channels", help="Runs to score, comma-separated: baseline (standard BM25, "
                                 "bm25s), lexical, semantic, hybrid.")] = options.DEFAULT_CHANNELS,
    fusion: Annotated[str | None, Opt("--fusion", help="Hybrid fusion: rrf, dbsf or convex (default: the "
                                      "engine's).")] = None,
    limit_docs: Annotated[str | None, Opt("--limit-docs", metavar="N",
                                          help="Judged-first subset of N docs; keeps fully judged queries.")] = None,
    peer: Annotated[str | None, Opt("--peer", help="Also run a peer side by side: lancedb (the bench "
                                    "extra).")] = None,
    rrf_k: Annotated[str | None, Opt("--rrf-k", metavar="K", help="RRF constant, with --fusion rrf "
                                     "(default: the engine's).")] = None,
    weights: Annotated[str | None, Opt("--weights", metavar="L,S", help="Score-fusion weights lexical,semantic, "
                                       "with --fusion dbsf or convex.")] = None,
    cache_dir: Annotated[Path | None, Opt("--cache-dir",
                                          help="Store cache root (default OUT/store; for a folder, "
                                          "OUT/<name>/store); keyed by corpus digest.")] = None,
    mapping: Annotated[str, Opt("--mapping", help="Doc -> capture: single (title+text) or split.")] = "single",
    progress: Annotated[bool, Opt("--progress/--no-progress", help="Progress bars on stderr.")] = True,
    threads: Annotated[str | None, Opt("--threads", metavar="N",
                                       help="torch intra-op threads (default: the engine's).")] = None,
    max_queries: Annotated[str | None, Opt("--max-queries", metavar="N",
                                           help="Score only the first N judged queries (CI smoke).")] = None,
    latency: Annotated[bool, Opt("--latency/--no-latency", help="Also time one limit-10 search per query.")] = True,
    store: Annotated[str | None, Opt("--store", help="Run on an initialised PostgreSQL store (postgresql://USER@"
                                     "HOST:PORT/DB) instead of DuckDB in the cache dir.")] = None,
    master_key_file: Annotated[Path | None, Opt("--master-key-file", help="That store's master key file.")] = None,
    model: Annotated[str | None, Opt("--model", help="Embedding model: " + " or ".join(options.MODELS)
                                     + " (default: the engine's).")] = None,
) -> None:
    """Score lexical, semantic and hybrid search on a BEIR collection through the real engine,
    next to standard BM25 (the baseline row).

    Try it from a clone: engram-memory eval --dataset eval/sample --out out/eval/sample
    """
    require_eval_extra()
    try:
        if dataset is None:
            raise OptionError("--dataset DIR is required: a BEIR collection folder (a clone has eval/sample)")
        out_dir = options.writable_dir("--out", out)
        run_channels = options.channels(channels)
        method = options.fusion(fusion)
        k_rrf = options.integer("--rrf-k", rrf_k)
        w = options.weights(weights)
        options.fusion_settings(run_channels, method, k_rrf, w)
        limit = options.integer("--limit-docs", limit_docs)
        max_q = options.integer("--max-queries", max_queries)
        n_threads = options.integer("--threads", threads)
        doc_mapping = options.choice("--mapping", mapping, options.MAPPINGS)
        peer_name = options.choice("--peer", peer, options.PEERS)
        cache = options.writable_dir("--cache-dir", cache_dir, required=False)
        if model is not None:
            model = options.choice("--model", model, options.MODELS)
        pg = options.store(store, master_key_file)
        folders = collection_folders(dataset)
        if not folders:
            check_layout(dataset, folders=True)
        options.peer_available(peer_name)
        options.baseline_available(run_channels)
        # A folder of collections: every one is read and checked before any work.
        cols = [_collection(f, limit) for f in folders] if folders else [_collection(dataset, limit)]
    except OptionError as exc:
        fail(str(exc))
    except CollectionError as exc:
        fail(f"--dataset {exc.path}: {exc.detail}")
    assert out_dir is not None and doc_mapping is not None
    for col in cols:
        for warning in col.warnings:
            say("eval", f"note: {col.name}: {warning}" if folders else f"note: {warning}")
    if folders:
        say("eval", f"{dataset}: a folder of {len(cols)} collections ({', '.join(c.name for c in cols)}); each in "
            "its own scope, then the mean")

    _make_dir("--out", out_dir)

    from engram_memory.eval.folder import run_folder
    from engram_memory.eval.harness import run_eval
    from engram_memory.eval.ingest import set_model, set_store
    from engram_memory.store.backend import StoreRefused
    from engram_memory.store.core.engine import StoreBusyError

    if pg is not None:
        set_store(*pg)
    if model is not None:
        set_model(model)

    run_options: dict[str, Any] = dict(channels=run_channels, fusion=method, rrf_k=k_rrf, weights=w, limit_docs=limit,
                       peer=peer_name, cache_dir=cache, mapping=doc_mapping, progress=progress, threads=n_threads,
                       max_queries=max_q, latency=latency)
    try:
        if folders:
            summary = run_folder(dataset, cols, out_dir, **run_options)
            rows = {f"{name} {run}": scores for name, row in summary["per_collection"].items()
                    for run, scores in row["runs"].items()}
            rows.update({f"mean {run}": scores for run, scores in summary["mean"].items()})
        else:
            results = run_eval(cols[0], out_dir, **run_options)
            rows = {f"{results['dataset']} {name:>8}": scores for name, scores in results["runs"].items()}
    except StoreBusyError as exc:
        fail(f"{exc} (another eval or a server holds it: wait, or pick another --cache-dir)")
    except StoreRefused as exc:
        fail(str(exc))
    sys.stderr.write(f"wrote {out_dir / 'results.json'}\n")
    sys.stdout.write(results_table(rows) + f"\nreport: {out_dir / 'report.md'}\nplot:   {out_dir / 'report.png'}\n")
    sys.stdout.flush()


def results_table(rows: dict[str, dict[str, float]]) -> str:
    """The scores as an aligned plain-text table (stdout: what the run found; progress went to stderr)."""
    metrics = list(dict.fromkeys(m for scores in rows.values() for m in scores))
    labels = [" ".join(label.split()) for label in rows]
    width = max([len("run"), *map(len, labels)])
    lines = ["run".ljust(width) + "".join(f"  {m:>10}" for m in metrics)]
    for label, scores in zip(labels, rows.values(), strict=True):
        lines.append(label.ljust(width) + "".join(
            f"  {scores[m]:>10.4f}" if m in scores else f"  {'-':>10}" for m in metrics))
    return "\n".join(lines)


def bench_cmd(
    out: Annotated[Path | None, Opt("--out", show_default=False,
                                    help="Output dir: bench.json, bench.md (and mcp-server-<size>.stderr, "
                                    "profile-<size>.txt). Required.")] = None,
    sizes: Annotated[str, Opt("--sizes", help="Store sizes, comma-separated.")] = "1000,10000,100000",
    dataset: Annotated[Path | None, Opt("--dataset", help="BEIR collection for record text and queries "
                                        "(default: synthetic Zipf text).")] = None,
    queries: Annotated[str, Opt("--queries", metavar="N", help="Queries per latency cell.")] = "200",
    ops_sample: Annotated[str, Opt("--ops-sample", metavar="N",
                                   help="Single captures+admissions timed per size.")] = "100",
    peer: Annotated[str | None, Opt("--peer", help="Also bench a peer: lancedb (needs the bench extra); "
                                    "without it the LanceDB ratios are reported as not measured.")] = None,
    mcp: Annotated[bool, Opt("--mcp/--no-mcp", help="Per size, also time searches through the real stdio "
                             "server (MCP SDK client) for the MCP ratio.")] = True,
    ingest_docs: Annotated[str, Opt("--ingest-docs", metavar="N",
                                    help="Per size, documents a host ingests through that server (capture + "
                                    "request_admission each, then a search) against the bulk floor (0: off).")]
    = "200",
    profile: Annotated[str, Opt("--profile", metavar="N",
                                help="cProfile N in-process hybrid searches per size into "
                                "OUT/profile-<size>.txt (0: off).")] = "0",
    progress: Annotated[bool, Opt("--progress/--no-progress", help="Progress bars on stderr.")] = True,
    threads: Annotated[str | None, Opt("--threads", metavar="N", help="torch intra-op threads (default: the "
                                       "engine's); the MCP server gets the same via OMP_NUM_THREADS.")] = None,
    resume: Annotated[bool, Opt("--resume", help="Keep OUT/bench-store from an earlier run and grow it on "
                                "(measure a new build at 100k without re-ingesting).")] = False,
    store: Annotated[str | None, Opt("--store", help="Bench the engine on an initialised, empty PostgreSQL store "
                                     "(postgresql://USER@HOST:PORT/DB; with --no-mcp).")] = None,
    master_key_file: Annotated[Path | None, Opt("--master-key-file", help="That store's master key file.")] = None,
    scopes: Annotated[str | None, Opt("--scopes", metavar="N", help="Instead: grow a store of N scopes and measure "
                                      "one node's memory and cold/warm search under --projection-memory "
                                      "(OUT/bench-scopes.json).")] = None,
    records: Annotated[str, Opt("--records", metavar="N", help="With --scopes: records in all.")] = "200000",
    projection_memory: Annotated[str, Opt("--projection-memory", help="With --scopes: the node's budget.")]
    = "512MiB",
    searches: Annotated[str, Opt("--searches", metavar="N", help="With --scopes: random searches over all "
                                 "scopes.")] = "1000",
) -> None:
    """Latency, throughput, rebuild time and memory of the real engine at several store sizes.

    Per size it also prints the target ratios, pass/fail: vs LanceDB, vs the sum of parts, 4 vs 1 searchers, MCP.
    """
    require_eval_extra()
    try:
        out_dir = options.writable_dir("--out", out)
        size_list = options.sizes(sizes)
        n_queries = options.integer("--queries", queries)
        n_ops = options.integer("--ops-sample", ops_sample)
        n_profile = options.integer("--profile", profile, minimum=0)
        n_ingest = options.integer("--ingest-docs", ingest_docs, minimum=0)
        n_threads = options.integer("--threads", threads)
        peer_name = options.choice("--peer", peer, options.PEERS)
        assert out_dir is not None
        if resume and not (out_dir / "bench-store").is_dir():
            raise OptionError(f"--resume: no store to resume at {out_dir / 'bench-store'} (run once without "
                              "--resume)")
        if dataset is not None:
            check_layout(dataset)
        options.peer_available(peer_name)
        pg = options.store(store, master_key_file)
        if pg is not None and mcp and scopes is None:
            raise OptionError("--store benches the engine in process: add --no-mcp (bench-http measures servers"
                              " on PostgreSQL)")
        if dataset is not None:
            _collection(dataset, None)
        n_scopes = options.integer("--scopes", scopes, minimum=3)
        n_records = options.integer("--records", records)
        n_searches = options.integer("--searches", searches)
        try:
            budget = parse_bytes("--projection-memory", projection_memory)
        except ValueError as exc:
            raise OptionError(str(exc)) from None
        if n_scopes is not None and n_records is not None and n_records < 4 * n_scopes:
            raise OptionError("--records must be at least 4 x --scopes")
    except OptionError as exc:
        fail(str(exc))
    except CollectionError as exc:
        fail(f"--dataset {exc.path}: {exc.detail}")
    if n_scopes is not None:
        if pg is not None:
            from engram_memory.eval.ingest import set_store

            set_store(*pg)
        _make_dir("--out", out_dir)
        from engram_memory.eval.bench_scopes import run_scope_bench

        assert n_records is not None and n_searches is not None
        run_scope_bench(out_dir, n_scopes, n_records, budget, n_searches, progress=progress)
        sys.stderr.write(f"wrote {out_dir / 'bench-scopes.json'}\n")
        return
    assert n_queries is not None and n_ops is not None and n_profile is not None and n_ingest is not None
    if pg is not None:
        from engram_memory.eval.ingest import set_store

        set_store(*pg)

    _make_dir("--out", out_dir)

    from engram_memory.eval.bench import run_bench
    from engram_memory.store.core.engine import StoreBusyError

    try:
        run_bench(out_dir, size_list, dataset=dataset, n_queries=n_queries, ops_sample=n_ops, peer=peer_name,
                  progress=progress, threads=n_threads, resume=resume, mcp=mcp, profile=n_profile,
                  ingest_docs=n_ingest)
    except StoreBusyError as exc:
        fail(f"{exc} (stop the server using it, or pick another --out)")
    except KeyboardInterrupt:
        sys.stderr.write(f"engram-memory: bench interrupted; sizes finished so far are in {out_dir / 'bench.json'}\n")
        raise typer.Exit(130) from None
    sys.stderr.write(f"wrote {out_dir / 'bench.json'} and bench.md\n")
