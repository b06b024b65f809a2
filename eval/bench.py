"""Performance bench through the real engine: search latency, ingest throughput, rebuild, memory.

One store grows through the requested sizes (1k -> 10k -> 100k). At each size:

* bulk growth: capture + admission in ``Engine.batch()`` chunks (what an import does),
  timed end to end including the batch's index commit and embedding -> records/s;
* single-op latency: ``ops_sample`` extra captures and admissions *outside* a batch, so each
  admission pays its own projection update (Tantivy commit, embed, vector save) as a host's
  one-at-a-time capture would;
* search latency p50/p95/p99 at limit 10 (the tool default) for ``lexical`` and ``hybrid``;
  hybrid twice: as shipped (query encoded inside search) and with the query vector
  precomputed (a memoising embedder proxy returns it, so the rest of the path is unchanged);
* rebuild: the host's ``rebuild-index`` path (``store.rebuild.rebuild_index``: open, rebuild
  every projection from DuckDB with the stored embeddings, close), as s per 10k records;
* peak RSS (``resource.getrusage``; a process-lifetime peak, so it is cumulative over sizes);
* the optional peer (LanceDB) over the same texts and the same stored vectors;
* the target ratios (``eval/bench_parts.py``): lexical and hybrid against LanceDB, hybrid against
  the sum of its parts (encode + BM25 + vector search, timed separately on the same queries),
  four concurrent searchers against one, and hybrid through the real stdio MCP server
  (``eval/bench_mcp.py``) against in-process hybrid plus the cheapest tool call's round trip;
  each with its target and pass/fail under ``ratios`` in bench.json, a table in bench.md and
  one line per ratio on stderr;
* optionally (``profile``) a cProfile of N in-process hybrid searches, OUT/profile-<size>.txt.

Record text comes from a BEIR collection (sentence chunks of its documents, the length of a
typical memory record) or, without one, from a seeded Zipf vocabulary.
"""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from engram_memory.eval.beir import Doc, load_collection, truncate_utf8
from engram_memory.eval.bench_parts import (
    SEARCHERS,
    breakdown_markdown,
    compute_ratios,
    concurrency,
    pcts,
    profile_searches,
    ratio_lines,
    ratios_markdown,
    search_args,
    time_parts,
    time_stages,
    timed,
)
from engram_memory.eval.ingest import (
    PURPOSE,
    admission_args,
    capture_args,
    host_context,
    open_engine,
    set_torch_threads,
    store_options,
    validated,
)
from engram_memory.models.tools import to_plain

PACKAGES = ("engram-memory", "tantivy", "hnswlib", "duckdb", "numpy", "onnxruntime", "tokenizers",
            "torch", "sentence-transformers", "detect-secrets", "ranx", "lancedb", "pyarrow")
BENCH_DATASET = "bench"
LIMIT = 10


# -- record and query text -------------------------------------------------------------------


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.strip()) > 20]


SYNTHETIC_WORDS = 20_000
SYNTHETIC_CHUNKS = 20_000


def text_chunks(dataset: Path | None, seed: int = 7) -> list[str]:
    """The distinct record texts: two-sentence chunks of the collection, or seeded Zipf text.

    The Zipf sampler draws exactly what ``rng.choice(vocab, size, p=p)`` per chunk would (same
    seed, same texts as earlier benches) with the cumulative distribution built once: the per-call
    ``choice`` re-built it for every chunk and took over a minute before the first record.
    """
    chunks: list[str] = []
    if dataset is not None:
        for d in load_collection(dataset).docs:
            sents = _sentences(d.text) or [d.title or d.text]
            chunks += [" ".join(sents[i:i + 2]) for i in range(0, len(sents), 2)]
        return chunks
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i:05d}" for i in range(SYNTHETIC_WORDS)])
    ranks = np.arange(1, len(vocab) + 1)
    p = (1.0 / ranks) / (1.0 / ranks).sum()
    cdf = p.cumsum()
    cdf /= cdf[-1]
    for _ in range(SYNTHETIC_CHUNKS):
        size = int(rng.integers(20, 60))
        chunks.append(" ".join(vocab[cdf.searchsorted(rng.random(size), side="right")]))
    return chunks


def record_texts(dataset: Path | None = None, seed: int = 7, chunks: Sequence[str] | None = None) -> Iterator[str]:
    """An endless stream of record texts: the chunks (``text_chunks``), then pairings.

    Past the collection's chunk count, chunk i is joined with a chunk far away, so every record
    text stays distinct (duplicates would flatter both IDF and the vector index).
    """
    if chunks is None:
        chunks = text_chunks(dataset, seed)
    n = len(chunks)
    for i in range(n):
        yield chunks[i]
    lap = 1
    while True:
        for i in range(n):
            yield chunks[i] + " " + chunks[(i * 7919 + lap * 104_729) % n]
        lap += 1


def bench_queries(dataset: Path | None, texts: Sequence[str], n: int, seed: int = 11) -> list[str]:
    if dataset is not None:
        col = load_collection(dataset)
        qs = [truncate_utf8(q) for q in col.queries.values() if q.strip()]
        if qs:
            return (qs * (n // len(qs) + 1))[:n]
    rng = np.random.default_rng(seed)
    out = []
    for i in rng.integers(0, len(texts), size=n):
        words = texts[int(i)].split()
        out.append(" ".join(rng.choice(words, size=min(5, len(words)), replace=False)))
    return out


# -- machine description ---------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram_gib = round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    versions: dict[str, str | None] = {}
    for pkg in PACKAGES:
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = None
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": ram_gib, "os": platform.platform(),
            "python": platform.python_version(), "packages": versions, "commit": _commit()}


def _commit() -> str | None:
    """The engine commit measured (a checkout with uncommitted edits is marked "+dirty")."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return rev + ("+dirty" if dirty else "") if rev else None


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# -- the embedder proxy for "precomputed query vector" runs --------------------------------


class PrecomputedQueries:
    """Wraps the engine's embedder: known query texts return their stored vector, others encode.

    Only ``encode`` is intercepted; state, model id and digest are the real embedder's, so the
    receipts and the rest of the search path are exactly the shipped ones.
    """

    def __init__(self, inner: Any, table: dict[str, np.ndarray]) -> None:
        self._inner = inner
        self._table = table

    def encode(self, texts: Sequence[str], *args: Any, **kwargs: Any) -> np.ndarray:
        if texts and all(t in self._table for t in texts):
            return np.stack([self._table[t] for t in texts])
        return self._inner.encode(texts, *args, **kwargs)

    def encode_query(self, text: str) -> np.ndarray:
        if text in self._table:
            return self._table[text]
        return self._inner.encode_query(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


# -- the bench -------------------------------------------------------------------------------


@dataclass
class Grower:
    """Adds records to the bench store; remembers each record's text for the peer."""

    engine: Any
    texts: Iterator[str]
    n: int = 0
    mapping: str = "single"

    def __post_init__(self) -> None:
        self.ctx = host_context(BENCH_DATASET)
        self.by_record: dict[str, str] = {}

    def adopt(self) -> None:
        """Continue a store an earlier bench grew: skip the texts it holds, remember its records."""
        count = self.engine.candidate_count(self.ctx.scope_ref)
        from engram_memory.store.core.engine import embedding_text

        for record in self.engine.live_records(self.ctx.scope_ref):
            self.by_record[record["record_id"]] = embedding_text(record)
        for _ in range(count):
            next(self.texts)
        self.n = count

    def _one(self, timings: tuple[list[float], list[float]] | None = None) -> None:
        text = next(self.texts)
        doc = Doc(f"r{self.n:07d}", "", text)
        args = validated("capture", capture_args(BENCH_DATASET, doc, self.mapping))
        t = time.perf_counter()
        cap = to_plain(self.engine.capture(self.ctx, args))
        t1 = time.perf_counter()
        adm = to_plain(self.engine.request_admission(self.ctx, validated("request_admission",
                                                                      admission_args(cap["candidate_id"]))))
        t2 = time.perf_counter()
        if timings is not None:
            timings[0].append(t1 - t)
            timings[1].append(t2 - t1)
        outcome = adm["outcome"]
        if outcome.get("record_id"):
            self.by_record[outcome["record_id"]] = text
        self.n += 1

    def grow_to(self, size: int, chunk: int, progress: bool) -> float:
        t0 = time.perf_counter()
        start = self.n
        bar = tqdm(total=size - start, desc=f"grow to {size:,}", unit="rec", file=sys.stderr,
                   disable=not progress, dynamic_ncols=True)
        while self.n < size:
            with self.engine.batch():
                for _ in range(min(chunk, size - self.n)):
                    self._one()
                    bar.update(1)
                bar.set_postfix_str("index + embed")
            bar.set_postfix_str("")
        bar.close()
        return time.perf_counter() - t0

    def next_captures(self, count: int) -> list[dict[str, Any]]:
        """Capture arguments of the next ``count`` documents, for a host to send (the MCP ingest)."""
        out = []
        for _ in range(count):
            out.append(capture_args(BENCH_DATASET, Doc(f"r{self.n:07d}", "", next(self.texts)), self.mapping))
            self.n += 1
        return out

    def single_ops(self, count: int) -> tuple[list[float], list[float]]:
        timings: tuple[list[float], list[float]] = ([], [])
        for _ in range(count):
            self._one(timings)
        return timings


# -- search timing ---------------------------------------------------------------------------


def _searcher(engine: Any, hybrid: bool) -> Any:
    """One limit-10 search as a host sends it (validated arguments, the whole search path)."""
    ctx = host_context(BENCH_DATASET)

    def search(q: str) -> Any:
        return to_plain(engine.search(ctx, validated("search", search_args(q, PURPOSE, LIMIT, hybrid))))

    return search


def _search_latency(engine: Any, queries: Sequence[str], warmup: int = 5, hybrid: bool = True) -> list[float]:
    return timed(_searcher(engine, hybrid), queries, warmup)


def _normalised(q: str) -> str:
    """The query text search() hands to its channels and to encode() (validated: NFC)."""
    return str(validated("search", {"query": q, "purpose_ref": PURPOSE}).query)


INGEST_DOCS = 200  # documents a host ingests through the stdio server per size (issue 23 §4), by default


def _ops(samples: Sequence[float]) -> dict[str, Any]:
    total = float(sum(samples))
    return {"ops_per_s": len(samples) / total if total else None, **pcts(samples)}


def run_bench(
    out: Path,
    sizes: Sequence[int] = (1_000, 10_000, 100_000),
    dataset: Path | None = None,
    n_queries: int = 200,
    ops_sample: int = 100,
    chunk: int = 1_000,
    peer: str | None = None,
    store_dir: Path | None = None,
    progress: bool = True,
    threads: int | None = None,
    resume: bool = False,
    mcp: bool = True,
    profile: int = 0,
    searchers: int = SEARCHERS,
    ingest_docs: int = INGEST_DOCS,
) -> dict[str, Any]:
    """``resume`` keeps a store an earlier bench grew (same ``out`` or ``store_dir``) and grows it
    on, so a new engine build is measured at 100k without an hour of re-ingest; sizes the store
    already has report no bulk-ingest figure. ``mcp`` adds the stdio-server run per size,
    ``profile`` > 0 writes a cProfile of that many hybrid searches to OUT/profile-<size>.txt."""
    t_start = time.perf_counter()
    _say(f"sizes {', '.join(f'{s:,}' for s in sorted(sizes))}; {n_queries} queries per latency cell, "
         f"{ops_sample} single ops per size" + (f", peer {peer}" if peer else "") + ("" if mcp else ", no MCP run"))
    _say(f"loading torch (intra-op threads: {threads or 'the engine default'})")
    torch_threads = set_torch_threads(threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    store = Path(store_dir) if store_dir else out / "bench-store"
    if not resume:
        shutil.rmtree(store, ignore_errors=True)  # the bench measures ingest: a fresh store
    store.mkdir(parents=True, exist_ok=True)
    peer_ok = None
    if peer == "lancedb":
        from engram_memory.eval import peer_lancedb

        peer_ok = peer_lancedb.unavailable()
        if peer_ok:
            print(f"peer lancedb skipped: {peer_ok}", file=sys.stderr)
    t = time.perf_counter()
    if dataset is None:
        _say(f"generating synthetic record text (Zipf over {SYNTHETIC_WORDS:,} words, seed 7)")
    else:
        _say(f"reading record text from {dataset} (two-sentence chunks)")
    chunks = text_chunks(dataset)
    _say(f"{len(chunks):,} distinct record texts in {time.perf_counter() - t:.1f}s")
    texts = record_texts(chunks=chunks)
    result: dict[str, Any] = {"machine": machine(), "config": {
        "sizes": list(sizes), "dataset": str(dataset) if dataset else "synthetic-zipf", "queries": n_queries,
        "ops_sample": ops_sample, "chunk": chunk, "limit": LIMIT, "torch_threads": torch_threads,
        "peer": peer, "mcp": mcp, "profile": profile, "searchers": searchers}, "sizes": {}}
    grower: Grower | None = None
    queries: list[str] = []
    for size in sorted(sizes):
        row: dict[str, Any] = {}
        t = time.perf_counter()
        _say(f"opening the store {store} and loading the embedding model" if grower is None
             else f"reopening the store for {size:,} records")
        with _open_engine(store, "hybrid") as engine:
            if grower is None:
                _say(f"model {engine.embedder.model_id} ready in {time.perf_counter() - t:.1f}s")
                grower = Grower(engine, texts)
                if resume:
                    grower.adopt()
                    _say(f"resuming a store of {grower.n:,} records")
                result["model"] = {"model_id": engine.embedder.model_id,
                                   "model_digest": engine.embedder.model_digest}
            grower.engine = engine
            before = grower.n
            if size > before:
                _say(f"growing the store to {size:,} records (capture + admission in batches of {chunk:,})")
            grow_s = grower.grow_to(size, chunk, progress)
            grown = max(0, size - before)
            row["bulk_ingest"] = {"records": grown, "seconds": grow_s,
                                  "records_per_s": grown / grow_s if grown and grow_s else None}
            _say(f"{size:,}: timing {ops_sample} single captures + admissions")
            cap, adm = grower.single_ops(ops_sample)
            row["capture"] = _ops(cap)
            row["admission"] = _ops(adm)  # includes the per-admission projection update
            row["records"] = grower.n
            if not queries:
                queries = bench_queries(dataset, list(grower.by_record.values()), n_queries)
            _say(f"{size:,}: timing {len(queries)} hybrid searches (as shipped, precomputed vector, encode alone)")
            row["search"] = _hybrid_latency(engine, queries)
            scope = host_context(BENCH_DATASET).scope_ref
            _say(f"{size:,}: timing the sum of parts and {searchers} concurrent searchers")
            row["parts"] = _guarded("sum of parts", time_parts, engine, scope, queries, _normalised)
            hybrid_search = _searcher(engine, hybrid=True)
            _say(f"{size:,}: where a hybrid search's time goes, stage by stage ({len(queries)} other queries)")
            unseen = bench_queries(dataset, list(grower.by_record.values()), 2 * len(queries))[len(queries):]
            row["stages"] = _guarded("stages", time_stages, engine, hybrid_search, unseen)
            row["concurrency"] = _guarded("concurrency", concurrency, hybrid_search, queries, searchers,
                                          per_searcher=min(len(queries), 100))
            if profile:
                row["profile"] = _guarded(
                    "profile", profile_searches, hybrid_search, queries, profile, out / f"profile-{size}.txt",
                    header=f"engram-memory bench: in-process hybrid search (limit {LIMIT}), {grower.n:,} records, "
                           f"commit {result['machine'].get('commit')}")
            if peer == "lancedb" and not peer_ok:
                _say(f"{size:,}: the LanceDB peer over the same texts and vectors")
                row["peer"] = _peer_bench(engine, grower, queries, out / "bench-lancedb")
            fusion = getattr(engine.config, "fusion", None)
        # The host's rebuild-index path (store.rebuild): opens the store, rebuilds every
        # projection from DuckDB (stored embeddings, no re-embedding), closes.
        from engram_memory.store.maintenance.rebuild import rebuild_index

        _say(f"{size:,}: rebuild-index, then lexical search latency")
        t = time.perf_counter()
        rebuilt = rebuild_index(store, show_progress=False, **store_options())
        rebuild_s = time.perf_counter() - t
        row["rebuild"] = {"seconds": rebuild_s, "seconds_per_10k": rebuild_s / (grower.n / 10_000),
                          "records": sum(s.records for s in rebuilt.scopes),
                          "vectors": sum(s.vectors for s in rebuilt.scopes)}
        # Lexical-only ranking is an engine config (EngineSettings.channels); one engine owns a
        # store at a time, so reopen the same store with that config.
        with _open_engine(store, "lexical") as engine:
            row["search"]["lexical"] = pcts(_search_latency(engine, queries, hybrid=False))
        # The rerank stage's cost (retrieval/rerank.py): the same hybrid searches with it off.
        with _open_engine(store, "hybrid", rerank=False) as engine:
            row["search"]["hybrid_without_rerank"] = pcts(_search_latency(engine, queries))
        row["peak_rss_mib"] = peak_rss_mib()
        ingest = grower.next_captures(ingest_docs) if mcp else []
        if ingest:
            _say(f"{size:,}: the ingest floor (one batch encode, one Tantivy commit) of {len(ingest)} documents")
            with _open_engine(store, "hybrid") as engine:
                engine.wait_semantic(600)
                row["ingest_floor"] = _guarded("ingest floor", ingest_floor, engine, ingest)
        # What a host sees: the same store through the real stdio server (the engine is closed;
        # the next size reopens it once the server has exited).
        if mcp:
            _say(f"{size:,}: hybrid searches through a real stdio server (MCP SDK client)")
            row["mcp"] = _mcp_row(store, queries, out / f"mcp-server-{size}.stderr",
                                  fusion=str(fusion.value if hasattr(fusion, "value") else fusion) if fusion else None,
                                  threads=threads, ingest=ingest)
            for rid, args in zip(row["mcp"].get("ingest", {}).pop("record_ids", []), ingest, strict=False):
                grower.by_record[rid] = args["payload"]["components"][0]["text"]  # the peer's next size has them
        else:
            row["mcp"] = {"skipped": "--no-mcp"}
        row["ratios"] = compute_ratios(row)
        result["sizes"][str(size)] = row
        _write(out, result)  # partial results survive an interrupted 100k run
        print(f"bench: {size:,} records done at {time.perf_counter() - t_start:.0f}s", file=sys.stderr)
        for line in ratio_lines(size, row["ratios"]):
            print(line, file=sys.stderr)
    result["elapsed_s"] = time.perf_counter() - t_start
    _write(out, result)
    return result


@contextmanager
def _open_engine(store: Path, channels: str, busy_wait_s: float = 30.0, **overrides: Any) -> Iterator[Any]:
    """open_engine, waiting out a just-stopped MCP server that still holds the data directory."""
    from engram_memory.store.core.engine import StoreBusyError

    deadline = time.monotonic() + busy_wait_s
    while True:
        cm = open_engine(store, channels, **overrides)
        try:
            engine = cm.__enter__()
            break
        except StoreBusyError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    try:
        yield engine
    except BaseException:
        if not cm.__exit__(*sys.exc_info()):
            raise
    else:
        cm.__exit__(None, None, None)


def _say(message: str) -> None:
    """A status line on stderr: what the bench is doing between (and before) its progress bars."""
    print(f"bench: {message}", file=sys.stderr, flush=True)


def _guarded(what: str, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """A ratio's measurement; a failure is recorded and printed, the rest of the size still runs."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 -- an hour of ingest must not be lost to one measurement
        msg = f"{type(exc).__name__}: {exc}"
        print(f"bench: {what} failed ({msg})", file=sys.stderr)
        return {"error": msg}


def ingest_floor(engine: Any, captures: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What making ``captures`` searchable costs at the least: their texts encoded in one batch by the
    engine's embedder, and their lexical documents put in a fresh Tantivy index with one commit."""
    import tempfile

    from engram_memory.retrieval.lexical import LexicalDoc
    from engram_memory.retrieval.projections import Projections
    from engram_memory.store.core.lifecycle import lexical_fields

    records = [{**args["payload"], "record_id": f"floor-{i}"} for i, args in enumerate(captures)]
    texts = ["\n".join(c["text"] for c in r["components"]) for r in records]
    with tempfile.TemporaryDirectory(prefix="engram-floor-") as tmp:
        projections = Projections(Path(tmp), lexical_config=engine.projections.lexical_config)
        t = time.perf_counter()
        engine.embedder.encode(texts)
        encode_s = time.perf_counter() - t
        projections.add_lexical("floor", [LexicalDoc(r["record_id"], lexical_fields(r)) for r in records], 1)
        seconds = time.perf_counter() - t
        projections.close()
    return {"documents": len(captures), "seconds": seconds, "encode_s": encode_s, "commit_s": seconds - encode_s}


def _mcp_row(store: Path, queries: Sequence[str], log_path: Path, fusion: str | None,
             threads: int | None, ingest: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The stdio-server measurements; a failure is recorded (and printed), never fatal to the run."""
    from engram_memory.eval.bench_mcp import McpBenchError, leaf_message, mcp_bench

    try:
        return mcp_bench(store, host_context(BENCH_DATASET), queries, log_path, limit=LIMIT, fusion=fusion,
                         threads=threads, ingest=ingest)
    except Exception as exc:  # noqa: BLE001 -- hours of ingest must not be lost to a server problem
        msg = str(exc) if isinstance(exc, McpBenchError) else leaf_message(exc)
        print(f"bench: MCP run failed ({msg}); see {log_path}", file=sys.stderr)
        return {"error": msg, "server_log": log_path.name}


def _hybrid_latency(engine: Any, queries: Sequence[str]) -> dict[str, Any]:
    """Hybrid as shipped, hybrid with the query vector precomputed, and the encode alone."""
    res: dict[str, Any] = {"hybrid": pcts(_search_latency(engine, queries))}
    real = engine.embedder
    table = {}
    for q in dict.fromkeys(queries):
        # keyed by the validated (NFC) query text: what search() hands to encode()
        table[_normalised(q)] = np.asarray(real.encode([q], kind="query")[0], np.float32)
    engine.embedder = PrecomputedQueries(real, table)
    try:
        res["hybrid_precomputed_vector"] = pcts(_search_latency(engine, queries))
    finally:
        engine.embedder = real
    enc = []
    for q in queries:
        t = time.perf_counter()
        real.encode([q], kind="query")
        enc.append(time.perf_counter() - t)
    res["query_encode"] = pcts(enc)
    return res


def _peer_bench(engine: Any, grower: Grower, queries: Sequence[str], root: Path) -> dict[str, Any]:
    from engram_memory.eval import peer_lancedb

    scope = host_context(BENCH_DATASET).scope_ref
    rids, mat = engine.stored_vectors(scope)  # the same vectors the engine searches
    t = time.perf_counter()
    lp = peer_lancedb.LancePeer(root, rids, [grower.by_record[r] for r in rids], mat)
    build_s = time.perf_counter() - t
    qv = {q: np.asarray(engine.embedder.encode([q], kind="query")[0], np.float32) for q in dict.fromkeys(queries)}
    fts, hyb, hyb_enc = [], [], []
    for q in queries[:5]:
        lp.hybrid(q, qv[q], LIMIT)
    for q in queries:
        t = time.perf_counter()
        lp.fts(q, LIMIT)
        fts.append(time.perf_counter() - t)
        t = time.perf_counter()
        lp.hybrid(q, qv[q], LIMIT)
        hyb.append(time.perf_counter() - t)
        t = time.perf_counter()
        lp.hybrid(q, np.asarray(engine.embedder.encode([q], kind="query")[0], np.float32), LIMIT)
        hyb_enc.append(time.perf_counter() - t)
    lp.close()
    return {"name": "lancedb", "version": peer_lancedb.peer_version(), "build_s": build_s,
            "lexical": pcts(fts), "hybrid": pcts(hyb_enc), "hybrid_precomputed_vector": pcts(hyb)}


# -- output ----------------------------------------------------------------------------------


def _write(out: Path, result: dict[str, Any]) -> None:
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    (out / "bench.md").write_text(markdown(result), encoding="utf-8")


def _f(x: Any, d: int = 1) -> str:
    return "—" if x is None else f"{x:,.{d}f}"


def markdown(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [
        "# engram-memory bench",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM, {m['os']}, Python {m['python']}.",
        "Packages: " + ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v) + ".",
        f"Engine commit: {m.get('commit') or 'unknown'}.",
        f"Records: {r['config']['dataset']}; {r['config']['queries']} queries per cell, search limit "
        f"{r['config']['limit']}, real search path (validation, packets, receipts); "
        f"torch threads {r['config'].get('torch_threads')}.",
        "",
        "## Search latency (ms)",
        "",
        "| records | run | p50 | p95 | p99 |",
        "|---:|---|---:|---:|---:|",
    ]
    for size, row in r["sizes"].items():
        s = row["search"]
        for name in ("lexical", "hybrid", "hybrid_without_rerank", "hybrid_precomputed_vector", "query_encode"):
            if s.get(name):
                lines.append(f"| {int(size):,} | engram {name} | {_f(s[name]['p50'], 2)} | {_f(s[name]['p95'], 2)} "
                             f"| {_f(s[name]['p99'], 2)} |")
        p = row.get("peer")
        if p:
            for name in ("lexical", "hybrid", "hybrid_precomputed_vector"):
                lines.append(f"| {int(size):,} | lancedb {name} | {_f(p[name]['p50'], 2)} | {_f(p[name]['p95'], 2)} "
                             f"| {_f(p[name]['p99'], 2)} |")
    lines += ["", "## Ingest, rebuild, memory", "",
              "| records | bulk ingest rec/s | capture ops/s | capture p50 / p95 ms | admission ops/s "
              "| admission p50 / p95 ms | rebuild s per 10k | peak RSS MiB |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for size, row in r["sizes"].items():
        c, a = row["capture"], row["admission"]
        lines.append(
            f"| {int(size):,} | {_f(row['bulk_ingest']['records_per_s'])} | {_f(c.get('ops_per_s'))} "
            f"| {_f(c.get('p50'), 2)} / {_f(c.get('p95'), 2)} | {_f(a.get('ops_per_s'))} "
            f"| {_f(a.get('p50'), 2)} / {_f(a.get('p95'), 2)} | {_f(row['rebuild']['seconds_per_10k'], 2)} "
            f"| {_f(row['peak_rss_mib'], 0)} |")
    ratios = []
    for size, row in r["sizes"].items():
        p = row.get("peer")
        if p:
            s = row["search"]
            for name in ("lexical", "hybrid", "hybrid_precomputed_vector"):
                ratios.append(f"| {int(size):,} | {name} | {_f(s[name]['p50'] / p[name]['p50'], 2)} "
                              f"| {_f(s[name]['p95'] / p[name]['p95'], 2)} |")
    if ratios:
        lines += ["", "## Latency ratio engram / lancedb (< 1: engram faster)", "",
                  "| records | run | p50 | p95 |", "|---:|---|---:|---:|", *ratios]
    lines += ratios_markdown(r["sizes"])
    lines += breakdown_markdown(r["sizes"])
    lines += ["", "Capture and admission are single operations outside a batch: each admission includes its "
              "projection update (Tantivy commit, embedding, vector save). Bulk ingest uses Engine.batch() "
              f"chunks of {r['config']['chunk']}. Peak RSS is the process-lifetime peak (cumulative).", ""]
    return "\n".join(lines)
