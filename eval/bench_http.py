"""``engram-memory bench-http``: many signing hosts at once against the real HTTP server.

By default the bench makes its own host keys (``engram-memory host keygen``, run as a
subprocess: eval never imports the server), starts ``python -m engram_memory.server.cli serve
--http 127.0.0.1:<free port> --rate-limit 0`` on a temporary data dir, seeds ``--records``
records (capture + admission) over HTTP into a few tenants, then, per client count, drives that
many concurrent SDK clients (``mcp.Client`` over streamable HTTP, one ``httpx2`` connection
pool each, all in this process's event loop) for a fixed time. Every client has its own
principal in one of the tenants and signs a fresh context per call (and a confirmation for
forget). The mix: 60 % search, 19 % get (of seeded records and its own admitted ones), 10 %
capture, 10 % request_admission (of its own pending candidates), 1 % forget (of its own
records). A call is timed from signing its context to its parsed result, as a host waits for it.

Reported per client count: calls/s, per tool count and p50/p99 latency (ms), errors (a
non-ok envelope other than an expected ``RATE_LIMITED``, or an exception), and the CPU each
side spent per call (this process; the server process, read from /proc when the bench
started it). The floors, measured in the same run: calls/s at N clients against 1 client
(scaling), and search and get p50 over HTTP against the same calls made in-process on an
engine holding the same seed records in a separate temporary data dir (the server owns its
own data dir).

``--url URL --host-keys FILE --key KEYFILE --token-file F`` benches a running server instead
(seeded tenants are named per run, so nothing it holds is touched; its rate limits apply:
``RATE_LIMITED`` answers are counted apart, outside calls/s and the latencies). Results: a
table on stderr, OUT/bench-http.json and OUT/bench-http.md. The pure parts (client-count
parsing, percentiles, summaries, ratios) are covered by tests/test_bench_http_units.py.

``--store URL --nodes 1,2`` (issue 22) benches PostgreSQL too: after one node on DuckDB (the
baseline, as without the option), each node count runs on a fresh database of the server at
URL (a role that may CREATE DATABASE), initialised by the real ``admin init-store``, every node
started with the master key it wrote; the same seed records (tenants spread over the nodes) and
the same client counts, each client on node ``i mod N``. Server CPU is the nodes' together.
The configurations are printed side by side, per client count, with calls/s and p50/p99 per
tool and their ratios to one node on DuckDB (``comparison`` in the JSON; ``configs`` holds each
configuration's rows; ``runs`` stays the baseline's). Each database is dropped afterwards.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import secrets  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import tomllib  # noqa: E402
import urllib.request  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Callable, Iterator, Mapping, Sequence  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated, Any  # noqa: E402

import typer  # noqa: E402

Opt = typer.Option

TOOL_PREFIX = "engram_memory_"
PURPOSE = "purpose:bench-http"
TOOLS = ("search", "get", "capture", "request_admission", "forget")
MIX: tuple[tuple[str, float], ...] = (
    ("search", 0.60), ("get", 0.19), ("capture", 0.10), ("request_admission", 0.10), ("forget", 0.01),
)
TENANTS = 4
WORKSPACE = "ws-bench"
SEARCH_LIMIT = 10
FLOOR_QUERIES = 200
READY_TIMEOUT_S = 600.0
KID = "bench-host"
SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "fe", "gi", "ho", "ju", "be")


class UsageError(ValueError):
    """A mistake in the command line: one line, exit 2."""


# ---- pure parts ---------------------------------------------------------------------------------


def parse_clients(value: str) -> list[int]:
    """``"1,4,16"`` -> ``[1, 4, 16]``: positive integers, de-duplicated, ascending."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts:
        raise UsageError("--clients needs at least one client count, e.g. 1,4,16")
    counts = set()
    for part in parts:
        try:
            n = int(part)
        except ValueError:
            raise UsageError(f"--clients takes positive integers separated by commas, not {part!r}") from None
        if not 1 <= n <= 512:
            raise UsageError(f"--clients: {n} is out of range (1..512)")
        counts.add(n)
    return sorted(counts)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile by linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError("q must be within 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(samples_s: Sequence[float]) -> dict[str, Any]:
    """Count, p50, p99 and mean in milliseconds of durations in seconds (``{"count": 0}`` if none)."""
    if not samples_s:
        return {"count": 0}
    ms = [s * 1e3 for s in samples_s]
    return {"count": len(ms), "p50": percentile(ms, 50), "p99": percentile(ms, 99), "mean": sum(ms) / len(ms)}


def ratio(label: str, numerator: float | None, denominator: float | None, unit: str) -> dict[str, Any]:
    """One floor ratio with its parts (value None when either side was not measured)."""
    value = None
    if numerator is not None and denominator is not None and denominator > 0:
        value = float(numerator) / float(denominator)
    return {"label": label, "value": value, "numerator": numerator, "denominator": denominator, "unit": unit}


def compute_ratios(runs: Sequence[Mapping[str, Any]], floor: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Scaling against the smallest client count, and HTTP p50 against the in-process floor."""
    if not runs:
        return []
    base = runs[0]
    out = [ratio(f"calls/s at {r['clients']} clients / at {base['clients']}", r["calls_per_s"],
                 base["calls_per_s"], "calls/s") for r in runs[1:]]
    for tool in ("search", "get"):
        floor_p50 = (floor.get(tool) or {}).get("p50")
        for r in runs:
            http_p50 = (r["tools"].get(tool) or {}).get("p50")
            out.append(ratio(f"{tool} p50 over HTTP at {r['clients']} clients / in-process", http_p50, floor_p50,
                             "ms"))
    return out


def parse_nodes(value: str) -> list[int]:
    """``"1,2"`` -> ``[1, 2]``: PostgreSQL node counts, de-duplicated, ascending, each within 1..8."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts:
        raise UsageError("--nodes needs at least one node count, e.g. 1,2")
    counts = set()
    for part in parts:
        try:
            n = int(part)
        except ValueError:
            raise UsageError(f"--nodes takes positive integers separated by commas, not {part!r}") from None
        if not 1 <= n <= 8:
            raise UsageError(f"--nodes: {n} is out of range (1..8)")
        counts.add(n)
    return sorted(counts)


def compare_configs(configs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every configuration's rows beside the first's (one node on DuckDB) at the same client count:
    calls/s and per-tool p50/p99, each with its ratio to the baseline (None where either is missing)."""
    if not configs:
        return []
    base = {r["clients"]: r for r in configs[0]["runs"]}
    rows = []
    for entry in configs:
        for run in entry["runs"]:
            ref = base.get(run["clients"])
            tools = {}
            for tool in TOOLS:
                mine = run["tools"].get(tool) or {}
                theirs = ((ref or {}).get("tools") or {}).get(tool) or {}
                tools[tool] = {"count": mine.get("count", 0), "p50": mine.get("p50"), "p99": mine.get("p99"),
                               "p50_ratio": ratio("", mine.get("p50"), theirs.get("p50"), "ms")["value"],
                               "p99_ratio": ratio("", mine.get("p99"), theirs.get("p99"), "ms")["value"]}
            rows.append({"config": entry["label"], "backend": entry["backend"], "nodes": entry["nodes"],
                         "clients": run["clients"], "calls_per_s": run["calls_per_s"],
                         "calls_per_s_ratio": ratio("", run["calls_per_s"], (ref or {}).get("calls_per_s"),
                                                    "calls/s")["value"],
                         "errors": run["errors"], "server_cpu_ms_per_call": run.get("server_cpu_ms_per_call"),
                         "store_cpu_ms_per_call": run.get("store_cpu_ms_per_call"),
                         "tools": tools})
    return rows


def comparison_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The side-by-side table: per configuration and client count, calls/s and p50/p99 per tool,
    with the ratio to one node on DuckDB at the same client count in parentheses."""
    lines = ["| config | clients | calls/s (× duckdb-1) | " + " | ".join(f"{t} p50 / p99 ms (× p50)" for t in TOOLS)
             + " | errors | CPU ms/call: nodes + PostgreSQL |", "|---|---:|---:|" + "---:|" * len(TOOLS) + "---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["clients"], r["nodes"], r["backend"] != "duckdb")):
        cells = [f"{_fmt(t['p50'])} / {_fmt(t['p99'])} ({_fmt(t['p50_ratio'], 2)}×)" for t in
                 (r["tools"][tool] for tool in TOOLS)]
        lines.append(f"| {r['config']} | {r['clients']} | {_fmt(r['calls_per_s'])} ({_fmt(r['calls_per_s_ratio'], 2)}×)"
                     f" | " + " | ".join(cells) + f" | {r['errors']} | {_fmt(r['server_cpu_ms_per_call'])}"
                     + (f" + {_fmt(r['store_cpu_ms_per_call'])}" if r.get("store_cpu_ms_per_call") is not None else "")
                     + " |")
    return "\n".join(lines) + "\n"


@dataclass
class ClientStats:
    """What one client saw: per-tool latencies (s), unexpected outcomes, rate limiting, exceptions."""

    samples: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TOOLS})
    errors: Counter[str] = field(default_factory=Counter)  # tool -> count
    error_codes: Counter[str] = field(default_factory=Counter)  # "tool:CODE" -> count
    rate_limited: int = 0
    exceptions: Counter[str] = field(default_factory=Counter)  # "tool:ExceptionType" -> count

    @property
    def calls(self) -> int:
        return sum(len(v) for v in self.samples.values())


def run_summary(clients: int, elapsed_s: float, stats: Sequence[ClientStats], *, client_cpu_s: float | None = None,
                server_cpu_s: float | None = None, store_cpu_s: float | None = None) -> dict[str, Any]:
    """One client count's row: throughput, per-tool latency and errors, CPU per call."""
    tools: dict[str, Any] = {}
    for tool in TOOLS:
        samples = [s for st in stats for s in st.samples[tool]]
        errors = sum(st.errors[tool] for st in stats) + sum(n for st in stats for k, n in st.exceptions.items()
                                                             if k.split(":", 1)[0] == tool)
        tools[tool] = {**summarize(samples), "errors": errors}
    calls = sum(st.calls for st in stats)
    codes: Counter[str] = Counter()
    exceptions: Counter[str] = Counter()
    for st in stats:
        codes.update(st.error_codes)
        exceptions.update(st.exceptions)
    return {
        "clients": clients,
        "seconds": elapsed_s,
        "calls": calls,
        "calls_per_s": calls / elapsed_s if elapsed_s > 0 else 0.0,
        "tools": tools,
        "errors": sum(t["errors"] for t in tools.values()),
        "error_codes": dict(sorted(codes.items())),
        "exceptions": dict(sorted(exceptions.items())),
        "rate_limited": sum(st.rate_limited for st in stats),
        "client_cpu_ms_per_call": client_cpu_s * 1e3 / calls if client_cpu_s is not None and calls else None,
        "server_cpu_ms_per_call": server_cpu_s * 1e3 / calls if server_cpu_s is not None and calls else None,
        # PostgreSQL's backends serving the nodes (None on DuckDB, which runs inside the server process)
        "store_cpu_ms_per_call": store_cpu_s * 1e3 / calls if store_cpu_s is not None and calls else None,
    }


def classify(tool: str, envelope: Mapping[str, Any]) -> str:
    """``ok`` (the expected outcome), ``rate_limited``, or the unexpected code."""
    if not envelope.get("ok"):
        code = str((envelope.get("error") or {}).get("code"))
        return "rate_limited" if code == "RATE_LIMITED" else code
    value = (envelope.get("output") or {}).get("value") or {}
    if tool == "capture" and value.get("status") != "committed_pending":
        return f"status:{value.get('status')}"
    if tool == "request_admission" and (value.get("outcome") or {}).get("status") != "accepted":
        return f"status:{(value.get('outcome') or {}).get('status')}"
    return "ok"


def _fmt(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def markdown(result: Mapping[str, Any]) -> str:
    """The throughput table, the per-tool latency table and the floor ratios, as markdown."""
    runs = result["runs"]
    base = runs[0]["calls_per_s"] if runs else None
    lines = ["| clients | calls | calls/s | vs 1st | errors | rate-limited | client CPU ms/call | server CPU ms/call |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        scale = r["calls_per_s"] / base if base else None
        lines.append(f"| {r['clients']} | {r['calls']:,} | {_fmt(r['calls_per_s'])} | {_fmt(scale, 2)}× | "
                     f"{r['errors']} | {r['rate_limited']} | {_fmt(r['client_cpu_ms_per_call'])} | "
                     f"{_fmt(r['server_cpu_ms_per_call'])} |")
    lines += ["", "| clients | " + " | ".join(f"{t} n / p50 / p99 ms" for t in TOOLS) + " |",
              "|---:|" + "---:|" * len(TOOLS)]
    for r in runs:
        cells = []
        for tool in TOOLS:
            t = r["tools"][tool]
            err = f" ({t['errors']} err)" if t["errors"] else ""
            cells.append(f"{t['count']:,} / {_fmt(t.get('p50'))} / {_fmt(t.get('p99'))}{err}")
        lines.append(f"| {r['clients']} | " + " | ".join(cells) + " |")
    floor = result.get("floor") or {}
    lines += ["", "| floor ratio | value | numerator / denominator |", "|---|---:|---|"]
    for entry in result.get("ratios", []):
        lines.append(f"| {entry['label']} | {_fmt(entry['value'], 2)} | {_fmt(entry['numerator'])} / "
                     f"{_fmt(entry['denominator'])} {entry['unit']} |")
    if floor:
        lines.append("")
        lines.append(f"In-process floor ({floor.get('channels')}, {floor.get('records')} records): search p50 "
                     f"{_fmt((floor.get('search') or {}).get('p50'), 2)} ms, get p50 "
                     f"{_fmt((floor.get('get') or {}).get('p50'), 2)} ms.")
    text = "\n".join(lines) + "\n"
    if result.get("comparison"):
        text += "\nSide by side (same load; ratios against one node on DuckDB):\n\n" + \
            comparison_markdown(result["comparison"])
    return text


def render(result: Mapping[str, Any]) -> None:
    """The same tables, with rich, on stderr (stdout stays clean)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)
    runs = result["runs"]
    base = runs[0]["calls_per_s"] if runs else None
    table = Table(title=f"bench-http ({result['config']['channels']}, {result['config']['seconds']:g} s per count; "
                  "per tool: p50/p99 ms)")
    for col in ("clients", "calls/s", "vs 1st", *TOOLS, "errors", "rate-limited"):
        table.add_column(col, justify="right")
    for r in runs:
        cells = [f"{_fmt(r['tools'][t].get('p50'))}/{_fmt(r['tools'][t].get('p99'))}" for t in TOOLS]
        scale = r["calls_per_s"] / base if base else None
        table.add_row(str(r["clients"]), _fmt(r["calls_per_s"]), f"{_fmt(scale, 2)}×", *cells, str(r["errors"]),
                      str(r["rate_limited"]))
    console.print(table)
    ratios = Table(title="against a floor, same run")
    for col in ("ratio", "value", "numerator / denominator"):
        ratios.add_column(col, justify="right" if col == "value" else "left")
    for entry in result.get("ratios", []):
        ratios.add_row(entry["label"], _fmt(entry["value"], 2),
                       f"{_fmt(entry['numerator'])} / {_fmt(entry['denominator'])} {entry['unit']}")
    console.print(ratios)
    if result.get("comparison"):
        side = Table(title="side by side, same load (per tool: p50/p99 ms, × p50 of duckdb-1)")
        for col in ("config", "clients", "calls/s", "× duckdb-1", *TOOLS, "errors", "CPU ms/call nodes+PG"):
            side.add_column(col, justify="left" if col == "config" else "right")
        for c in sorted(result["comparison"], key=lambda r: (r["clients"], r["nodes"], r["backend"] != "duckdb")):
            side.add_row(c["config"], str(c["clients"]), _fmt(c["calls_per_s"]), f"{_fmt(c['calls_per_s_ratio'], 2)}×",
                         *(f"{_fmt(t['p50'])}/{_fmt(t['p99'])} ({_fmt(t['p50_ratio'], 2)}×)"
                           for t in (c["tools"][tool] for tool in TOOLS)), str(c["errors"]),
                         _fmt(c["server_cpu_ms_per_call"]) + (f"+{_fmt(c['store_cpu_ms_per_call'])}"
                                                              if c.get("store_cpu_ms_per_call") is not None else ""))
        console.print(side)
    for entry in result.get("configs", []):
        for r in entry["runs"]:
            if r["error_codes"] or r["exceptions"]:
                console.print(f"{entry['label']}, {r['clients']} clients: errors {r['error_codes']} "
                              f"exceptions {r['exceptions']}")


# ---- workload -----------------------------------------------------------------------------------


def vocabulary(n: int = 1500, seed: int = 5) -> list[str]:
    rng = random.Random(seed)
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))))
    return sorted(words)


class Texts:
    """Record texts over a Zipf-weighted pseudo-word vocabulary; queries are words of seed records."""

    def __init__(self, seed: int = 7) -> None:
        self.vocab = vocabulary()
        self.weights = [1.0 / (rank + 1) for rank in range(len(self.vocab))]
        self.rng = random.Random(seed)

    def text(self, serial: str, rng: random.Random | None = None) -> str:
        r = rng or self.rng
        words = r.choices(self.vocab, weights=self.weights, k=r.randint(12, 30))
        return " ".join(words) + f". Note {serial}."

    def query(self, text: str, rng: random.Random) -> str:
        words = sorted(set(text.split(".")[0].split()))
        return " ".join(rng.sample(words, min(3, len(words))))


def sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def capture_arguments(text: str, key: str) -> dict[str, Any]:
    now_ms = int(time.time() * 1000) - 60_000
    return {
        "idempotency_key": key,
        "payload": {
            "schema_version": 2,
            "purpose_ref": PURPOSE,
            "valid_time": {"t": now_ms},
            "components": [{"component_id": "c1", "kind": "context", "text": text, "citation_ids": ["s1"]}],
            "primary_component_id": "c1",
            "primary_event": {"at": now_ms, "type_ref": "event:noted", "citation_id": "s1"},
            "citations": [{"citation_id": "s1", "source_ref": "bench:http",
                           "locator": {"scheme": "bench", "value": key}, "content_digest": sha(text)}],
        },
        "evidence": {"evidence_ref": "bench:http", "evidence_digest": sha("evidence\0" + text), "citation_ids": ["s1"]},
    }


def search_arguments(query: str, semantic: bool) -> dict[str, Any]:
    args: dict[str, Any] = {"query": query, "purpose_ref": PURPOSE, "limit": SEARCH_LIMIT}
    if semantic:  # never a silent lexical fallback: hybrid or RANKING_UNAVAILABLE
        args["capability_policy"] = {"minimum_channels": "lexical_and_semantic", "network": "forbid"}
    return args


@dataclass
class Seed:
    """The seed corpus: texts per tenant, their record ids over HTTP, and the query list."""

    tenants: list[str]
    texts: dict[str, list[str]]
    record_ids: dict[str, list[str]] = field(default_factory=dict)
    queries: dict[str, list[str]] = field(default_factory=dict)


def make_seed(records: int, tenant_prefix: str, texts: Texts) -> Seed:
    tenants = [f"{tenant_prefix}-t{k}" for k in range(TENANTS)]
    by_tenant: dict[str, list[str]] = {t: [] for t in tenants}
    for i in range(records):
        by_tenant[tenants[i % TENANTS]].append(texts.text(f"seed {i}"))
    rng = random.Random(11)
    queries = {t: [texts.query(rng.choice(ts), rng) for _ in range(FLOOR_QUERIES)] for t, ts in by_tenant.items()}
    return Seed(tenants, by_tenant, queries=queries)


# ---- the in-process floor -----------------------------------------------------------------------


def in_process_floor(seed: Seed, semantic: bool, workdir: Path) -> dict[str, Any]:
    """The same seed records in an engine of this process; search and get timed one at a time."""
    from engram_memory.eval.ingest import open_engine, validated
    from engram_memory.models.context import HostContext

    store = workdir / "floor-store"
    channels = "hybrid" if semantic else "lexical"
    t0 = time.perf_counter()
    with open_engine(store, channels, semantic=semantic) as engine:  # as the server: no model when lexical
        ids: dict[str, list[str]] = {}
        with engine.batch():
            for tenant, texts in seed.texts.items():
                ctx = HostContext(tenant, WORKSPACE, "bench-seed", "bench-agent", PURPOSE)
                for i, text in enumerate(texts):
                    cap = engine.capture(ctx, validated("capture", capture_arguments(text, f"floor-{tenant}-{i:06d}")))
                    adm = engine.request_admission(ctx, validated("request_admission", {
                        "candidate_id": cap.candidate_id, "idempotency_key": f"floor-adm-{tenant}-{i:06d}"}))
                    ids.setdefault(tenant, []).append(adm.outcome.record_id)
        if semantic:
            engine.wait_semantic(None)
        seeded_s = time.perf_counter() - t0
        timings: dict[str, list[float]] = {"search": [], "get": []}
        rng = random.Random(3)
        for i in range(FLOOR_QUERIES + 10):
            tenant = seed.tenants[i % len(seed.tenants)]
            ctx = HostContext(tenant, WORKSPACE, "bench-floor", "bench-agent", PURPOSE)
            search = validated("search", search_arguments(seed.queries[tenant][i % FLOOR_QUERIES], semantic))
            get = validated("get", {"record_id": rng.choice(ids[tenant]), "purpose_ref": PURPOSE})
            t = time.perf_counter()
            engine.search(ctx, search)
            dt_search = time.perf_counter() - t
            t = time.perf_counter()
            engine.get(ctx, get)
            dt_get = time.perf_counter() - t
            if i >= 10:  # warm-up
                timings["search"].append(dt_search)
                timings["get"].append(dt_get)
    shutil.rmtree(store, ignore_errors=True)
    return {"channels": channels, "records": sum(len(v) for v in seed.texts.values()), "seed_s": seeded_s,
            "search": summarize(timings["search"]), "get": summarize(timings["get"])}


# ---- the server and its keys --------------------------------------------------------------------


@dataclass
class Target:
    """Where the clients connect and how they sign."""

    url: str
    kid: str
    key_pem: bytes
    token: str
    audience: str
    server_pid: int | None = None  # the server process when the bench started it
    log: Path | None = None
    store_url: str | None = None  # its PostgreSQL database, when the bench created it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    return env


def make_keys(keys_dir: Path) -> None:
    """The real keygen, through the CLI (eval never imports the server package)."""
    argv = [sys.executable, "-m", "engram_memory.server.cli", "host", "keygen", "--out", str(keys_dir), "--kid", KID,
            "--scope", "*/*"]  # the bench's clients spread over several tenants
    done = subprocess.run(argv, env=server_env(), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"host keygen failed: {(done.stderr or done.stdout).strip()[-400:]}")


def wait_healthy(base: str, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=1) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


@contextmanager
def own_nodes(workdir: Path, out: Path, semantic: bool, store: str | None = None, nodes: int = 1,
              label: str = "duckdb-1") -> Iterator[list[Target]]:
    """``nodes`` × ``serve --http`` with no rate limit, stopped (SIGTERM) on exit. ``store`` None: one
    node on DuckDB in a fresh data dir. ``store`` a PostgreSQL admin URL: a fresh database initialised
    by the real ``admin init-store``, every node on it with the master key it wrote, dropped on exit."""
    keys_dir = workdir / "keys"
    if not keys_dir.is_dir():
        make_keys(keys_dir)
    base = workdir / label
    base.mkdir()
    from engram_memory.store.opening import shared

    args, db_url = StoreArgs(), None
    if store is not None:
        db_url = shared(store).create_database(store, "engram_bench_http")
        init_store(db_url, base / "master.key")
        args = StoreArgs(db_url, base / "master.key")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        targets = []
        for k in range(nodes):
            log = out / ("server.stderr" if store is None else f"server-{label}-{k}.stderr")
            proc, url = start_node(base / f"node-{k}", keys_dir, log, args, semantic, log_mode="w")
            procs.append(proc)
            targets.append(Target(url + "/mcp", KID, (keys_dir / f"{KID}.private.pem").read_bytes(),
                                  (keys_dir / f"{KID}.token").read_text().strip(),
                                  read_audience(keys_dir / "host-keys.toml"), proc.pid, log, db_url))
        yield targets
    finally:
        for proc in procs:
            stop(proc)
        if db_url is not None and store is not None:
            shared(store).drop_database(store, db_url)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---- a PostgreSQL store of the bench's own (shared with engram-memory crash) ---------------------


def check_admin_url(url: str) -> str:
    """A password-free libpq URL of a role that may CREATE DATABASE; reachable, else UsageError."""
    from engram_memory.store.opening import shared

    kind = shared(url)
    try:
        kind.check_url(url)
    except ValueError as exc:
        raise UsageError(f"--store: {exc}") from None
    if not kind.reachable(url):
        raise UsageError("--store: cannot connect to that PostgreSQL (the harness needs a role that may "
                         "CREATE DATABASE)")
    return url


def init_store(url: str, key_out: Path) -> None:
    """The real ``engram-memory admin init-store`` (schema, store identity, a new master key file)."""
    argv = [sys.executable, "-m", "engram_memory.server.cli", "admin", "init-store", "--store", url,
            "--master-key-out", str(key_out)]
    done = subprocess.run(argv, env=server_env(), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"admin init-store failed: {(done.stderr or done.stdout).strip()[-400:]}")


@dataclass(frozen=True)
class StoreArgs:
    """How a node reaches its store: DuckDB in its data dir (url None) or a shared PostgreSQL."""

    url: str | None = None
    master_key_file: Path | None = None

    def argv(self) -> list[str]:
        if self.url is None:
            return []
        return ["--store", self.url, "--master-key-file", str(self.master_key_file)]


def start_node(data_dir: Path, keys_dir: Path, log: Path, store: StoreArgs | None = None, semantic: bool = False,
               env: Mapping[str, str] | None = None, log_mode: str = "a") -> tuple[subprocess.Popen[bytes], str]:
    """``serve --http`` on a free port with no rate limit; (process, base URL) once healthy."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for _attempt in range(3):  # another process may take the free port between probe and bind
        port = free_port()
        argv = [sys.executable, "-m", "engram_memory.server.cli", "serve", "--http", f"127.0.0.1:{port}",
                "--data-dir", str(data_dir), "--host-keys", str(keys_dir / "host-keys.toml"), "--rate-limit", "0",
                "--log-level", "WARNING", *(store or StoreArgs()).argv()]
        if not semantic:
            argv.append("--no-semantic")
        with log.open(log_mode) as err:
            proc = subprocess.Popen(argv, env={**server_env(), **(env or {})}, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=err)
        base = f"http://127.0.0.1:{port}"
        if wait_healthy(base, proc, timeout=180):
            return proc, base
        stop(proc)
    raise RuntimeError(f"the server did not start; see {log}")


def read_audience(host_keys: Path) -> str:
    with host_keys.open("rb") as fh:
        server_id = tomllib.load(fh).get("server_id")
    if not isinstance(server_id, str) or not server_id:
        raise UsageError(f"{host_keys} has no server_id")
    return server_id


def external_target(url: str, host_keys: Path, key: Path, token_file: Path) -> Target:
    """A running server: the kid is the host-keys entry whose public key matches --key."""
    from engram_memory.models.hostauth import load_private_key, public_pem

    for path in (host_keys, key, token_file):
        if not path.is_file():
            raise UsageError(f"{path} is not a file")
    try:
        public = public_pem(load_private_key(key.read_bytes())).strip()
    except ValueError as exc:
        raise UsageError(f"--key {key}: {exc}") from None
    try:
        with host_keys.open("rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"--host-keys {host_keys} is not valid TOML: {exc}") from None
    kid = next((h.get("kid") for h in data.get("host", []) if isinstance(h, dict)
                and str(h.get("public_key_pem", "")).strip() == public), None)
    if not isinstance(kid, str):
        raise UsageError(f"--key {key} matches no host in {host_keys}")
    return Target(url, kid, key.read_bytes(), token_file.read_text().strip(), read_audience(host_keys))


def store_backends_cpu(targets: Sequence[Target]) -> dict[int, float] | None:
    """CPU seconds so far of each PostgreSQL backend serving the bench's database, by pid (from
    /proc: only when PostgreSQL runs on this machine; None otherwise, and on DuckDB)."""
    url = targets[0].store_url if targets else None
    if url is None:
        return None
    from engram_memory.store.opening import shared

    pids = shared(url).backend_pids(url)
    seconds = {pid: cpu_seconds(pid) for pid in pids}
    if pids and all(v is None for v in seconds.values()):
        return None  # a PostgreSQL elsewhere: its CPU is not visible here
    return {pid: v for pid, v in seconds.items() if v is not None}


def servers_cpu(targets: Sequence[Target]) -> float | None:
    """CPU seconds of every node the bench started, together (None unless it started them all)."""
    seconds = [cpu_seconds(t.server_pid) for t in targets]
    return None if any(s is None for s in seconds) else sum(s for s in seconds if s is not None)


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU of a process so far (Linux /proc), or None."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


# ---- clients ------------------------------------------------------------------------------------


class Host:
    """One SDK client with its signed identity."""

    def __init__(self, client: Any, signer: Any, host: Any) -> None:
        self.client = client
        self.signer = signer
        self.host = host

    async def list_tools(self) -> list[str]:
        from engram_memory.models.context import ALL_TOOLS
        from engram_memory.models.hostauth import CONTEXT_META_KEY

        meta = {CONTEXT_META_KEY: self.signer.context(self.host, ALL_TOOLS)}
        result = await self.client.list_tools(meta=meta, cache_mode="bypass")
        return [tool.name for tool in result.tools]

    async def call(self, tool: str, arguments: dict[str, Any], confirm: bool = False) -> dict[str, Any]:
        from engram_memory.models.context import ALL_TOOLS
        from engram_memory.models.hostauth import CONFIRMATION_META_KEY, CONTEXT_META_KEY

        meta: dict[str, Any] = {CONTEXT_META_KEY: self.signer.context(self.host, ALL_TOOLS)}
        if confirm:  # a host asks its human first; the bench is its own human
            meta[CONFIRMATION_META_KEY] = self.signer.confirmation(tool, self.host, arguments)
        result = await self.client.call_tool(TOOL_PREFIX + tool, arguments, meta=meta)
        envelope = getattr(result, "structured_content", None)
        if not isinstance(envelope, dict):
            envelope = json.loads(result.content[0].text)
        return envelope


def connect(target: Target, tenant: str, principal: str) -> Any:
    """An async context manager yielding a connected :class:`Host`."""
    from contextlib import asynccontextmanager

    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from engram_memory.models.context import HostContext
    from engram_memory.models.hostauth import HostSigner, load_private_key

    signer = HostSigner(target.kid, load_private_key(target.key_pem), target.audience)
    host = HostContext(tenant, WORKSPACE, principal, "bench-agent", PURPOSE, f"sess-{principal}")

    @asynccontextmanager
    async def session() -> Any:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {target.token}"},
                                  timeout=httpx2.Timeout(60, read=300))
        async with http, Client(streamable_http_client(target.url, http_client=http)) as client:
            h = Host(client, signer, host)
            await h.list_tools()  # signed: fills the SDK's output-schema cache (unsigned, it lists nothing)
            yield h

    return session()


async def wait_semantic(target: Target, seed: Seed) -> None:
    """The server loads the model in the background: hybrid searches are refused until then."""
    import anyio

    async with connect(target, seed.tenants[0], "bench-ready") as h:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            env = await h.call("search", search_arguments("ready", True))
            if env.get("ok"):
                return
            code = (env.get("error") or {}).get("code")
            if code != "RANKING_UNAVAILABLE" or time.monotonic() > deadline:
                raise RuntimeError(f"the server cannot search hybrid: {code}")
            await anyio.sleep(0.5)


async def seed_http(targets: list[Target], seed: Seed, run_id: str, tick: Callable[[int], None]) -> None:
    """Capture + admission of every seed text, one seeding client per tenant (tenants spread over the nodes)."""
    import anyio

    async def one(tenant: str) -> None:
        ids: list[str] = []
        target = targets[seed.tenants.index(tenant) % len(targets)]
        async with connect(target, tenant, "bench-seed") as h:
            for i, text in enumerate(seed.texts[tenant]):
                cap = await h.call("capture", capture_arguments(text, f"bh-{run_id}-seed-{tenant}-{i:06d}"))
                if not cap.get("ok"):
                    raise RuntimeError(f"seed capture failed: {cap.get('error')}")
                cid = cap["output"]["value"]["candidate_id"]
                adm = await h.call("request_admission", {"candidate_id": cid,
                                                         "idempotency_key": f"bh-{run_id}-seed-adm-{tenant}-{i:06d}"})
                outcome = ((adm.get("output") or {}).get("value") or {}).get("outcome") or {}
                if outcome.get("status") != "accepted":
                    raise RuntimeError(f"seed admission was not accepted: {adm.get('error') or outcome.get('status')}")
                ids.append(outcome["record_id"])
                tick(1)
        seed.record_ids[tenant] = ids

    async with anyio.create_task_group() as tg:
        for tenant in seed.tenants:
            tg.start_soon(one, tenant)


async def client_loop(target: Target, seed: Seed, texts: Texts, semantic: bool, tenant: str, principal: str,
                      index: int, ready: Any, go: Any, stop_at: list[float], stats: ClientStats,
                      counter: list[int]) -> None:
    """One client: connect, wait for the start, then the mix until the deadline."""
    rng = random.Random(index * 7919 + 1)
    tools = [t for t, _ in MIX]
    weights = [w for _, w in MIX]
    pending: list[str] = []
    own: list[str] = []
    serial = 0
    async with connect(target, tenant, principal) as h:
        ready()
        await go.wait()
        while time.perf_counter() < stop_at[0]:
            tool = rng.choices(tools, weights)[0]
            if tool == "request_admission" and not pending:
                tool = "capture"
            if tool == "forget" and not own:
                tool = "get"
            serial += 1
            confirm = False
            if tool == "search":
                args = search_arguments(rng.choice(seed.queries[tenant]), semantic)
            elif tool == "get":
                args = {"record_id": rng.choice(seed.record_ids[tenant] + own), "purpose_ref": PURPOSE}
            elif tool == "capture":
                args = capture_arguments(texts.text(f"{principal} {serial}", rng), f"bh-{principal}-cap-{serial:07d}")
            elif tool == "request_admission":
                args = {"candidate_id": pending[0], "idempotency_key": f"bh-{principal}-adm-{serial:07d}"}
            else:
                args = {"record_id": own.pop(rng.randrange(len(own))), "idempotency_key": f"bh-{principal}-fg-"
                        f"{serial:07d}", "reason_ref": "reason:bench"}
                confirm = True
            t = time.perf_counter()
            try:
                env = await h.call(tool, args, confirm)
            except Exception as exc:  # noqa: BLE001 -- counted and reported, the run goes on
                stats.exceptions[f"{tool}:{type(exc).__name__}"] += 1
                continue
            dt = time.perf_counter() - t
            outcome = classify(tool, env)
            if outcome == "rate_limited":  # refused before any work: counted apart, not as a timed call
                stats.rate_limited += 1
                continue
            stats.samples[tool].append(dt)
            counter[0] += 1
            if outcome != "ok":
                stats.errors[tool] += 1
                stats.error_codes[f"{tool}:{outcome}"] += 1
            elif tool == "capture":
                pending.append(env["output"]["value"]["candidate_id"])
            if tool == "request_admission":
                pending.pop(0)  # admitted, or never retried: a stuck candidate would fail every later admission
                if outcome == "ok":
                    own.append(env["output"]["value"]["outcome"]["record_id"])


async def run_clients(targets: list[Target], seed: Seed, texts: Texts, semantic: bool, n: int, seconds: float,
                      run_id: str, progress: Any) -> dict[str, Any]:
    """``n`` clients for ``seconds``, client i on node i mod the node count."""
    import anyio

    stats = [ClientStats() for _ in range(n)]
    counter = [0]
    go = anyio.Event()
    connected = [0]
    all_ready = anyio.Event()
    stop_at = [math.inf]

    def ready() -> None:
        connected[0] += 1
        if connected[0] == n:
            all_ready.set()

    task = progress.add_task(f"{n} client(s)", total=seconds, calls="connecting")
    result: dict[str, Any] = {}

    async def conductor() -> None:
        await all_ready.wait()
        cpu0, server0, store0 = time.process_time(), servers_cpu(targets), store_backends_cpu(targets)
        start = time.perf_counter()
        stop_at[0] = start + seconds
        go.set()
        while time.perf_counter() < stop_at[0]:
            elapsed = time.perf_counter() - start
            progress.update(task, completed=min(elapsed, seconds),
                            calls=f"{counter[0]:,} calls, {counter[0] / max(elapsed, 1e-9):,.1f}/s")
            await anyio.sleep(0.25)
        result.update(cpu0=cpu0, server0=server0, store0=store0, start=start)

    async with anyio.create_task_group() as tg:
        tg.start_soon(conductor)
        for i in range(n):
            tenant = seed.tenants[i % len(seed.tenants)]
            tg.start_soon(client_loop, targets[i % len(targets)], seed, texts, semantic, tenant,
                          f"bh-{run_id}-n{n}-c{i}", i, ready, go, stop_at, stats[i], counter)
    elapsed = time.perf_counter() - result["start"]  # calls in flight at the deadline finish and count
    server1 = servers_cpu(targets)
    server_cpu = server1 - result["server0"] if server1 is not None and result["server0"] is not None else None
    store1 = store_backends_cpu(targets)
    store_cpu = None
    if store1 is not None and result["store0"] is not None:  # a session opened meanwhile counts from its start
        store_cpu = sum(cpu - result["store0"].get(pid, 0.0) for pid, cpu in store1.items())
    summary = run_summary(n, elapsed, stats, client_cpu_s=time.process_time() - result["cpu0"],
                          server_cpu_s=server_cpu, store_cpu_s=store_cpu)
    progress.update(task, completed=seconds, calls=f"{summary['calls']:,} calls, {summary['calls_per_s']:,.1f}/s, "
                    f"{summary['errors']} errors")
    return summary


# ---- the command --------------------------------------------------------------------------------


@dataclass
class BenchConfig:
    clients: list[int]
    seconds: float
    out: Path
    records: int
    semantic: bool
    url: str | None = None
    host_keys: Path | None = None
    key: Path | None = None
    token_file: Path | None = None
    progress: bool = True
    store: str | None = None  # a PostgreSQL admin URL: also run one and several nodes on a fresh database
    nodes: list[int] = field(default_factory=lambda: [1, 2])  # PostgreSQL node counts (with store)


def run_bench_http(cfg: BenchConfig, argv: Sequence[str] = ()) -> dict[str, Any]:
    import anyio
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from engram_memory.eval.bench import machine

    cfg.out.mkdir(parents=True, exist_ok=True)
    run_id = time.strftime("%Y%m%d%H%M%S") + "-" + secrets.token_hex(3)
    texts = Texts()
    seed = make_seed(cfg.records, f"bh-{run_id}", texts)
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), TextColumn("{task.fields[calls]}"))
    result: dict[str, Any] = {
        "command": ["engram-memory", "bench-http", *argv],
        "machine": machine(),
        "config": {"clients": cfg.clients, "seconds": cfg.seconds, "records": cfg.records, "tenants": TENANTS,
                   "channels": "hybrid" if cfg.semantic else "lexical", "mix": dict(MIX),
                   "server": cfg.url or "own (serve --http, --rate-limit 0)", "search_limit": SEARCH_LIMIT,
                   "run_id": run_id, "configurations": ["duckdb-1", *(f"postgresql-{n}" for n in cfg.nodes)]
                   if cfg.store else ["duckdb-1" if cfg.url is None else "external-1"]},
        "runs": [],
        "configs": [],
    }
    with tempfile.TemporaryDirectory(prefix="engram-bench-http-") as tmp, \
            Progress(*columns, console=console, disable=not cfg.progress) as progress:
        workdir = Path(tmp)
        floor_task = progress.add_task("in-process floor", total=None, calls="")
        result["floor"] = in_process_floor(seed, cfg.semantic, workdir)
        progress.update(floor_task, total=1, completed=1,
                        calls=f"search p50 {result['floor']['search']['p50']:.2f} ms")

        # One node on DuckDB first (the baseline), then each PostgreSQL node count, same load each time.
        setups: list[tuple[str, str | None, int]] = [("duckdb" if cfg.url is None else "external", None, 1)]
        if cfg.store is not None:
            setups += [("postgresql", cfg.store, n) for n in cfg.nodes]

        @contextmanager
        def targets(store: str | None, nodes: int, label: str) -> Iterator[list[Target]]:
            if cfg.url is None:
                with own_nodes(workdir, cfg.out, cfg.semantic, store, nodes, label) as ts:
                    yield ts
            else:
                assert cfg.host_keys and cfg.key and cfg.token_file
                yield [external_target(cfg.url, cfg.host_keys, cfg.key, cfg.token_file)]

        for backend, store, nodes in setups:
            label = f"{backend}-{nodes}"
            entry: dict[str, Any] = {"label": label, "backend": backend, "nodes": nodes, "runs": []}
            result["configs"].append(entry)
            seed.record_ids.clear()
            with targets(store, nodes, label) as tgts:
                if cfg.semantic:
                    for tgt in tgts:  # every node loads its own model
                        anyio.run(wait_semantic, tgt, seed)
                seed_task = progress.add_task(f"{label}: seed over HTTP", total=cfg.records, calls="")
                t0 = time.perf_counter()
                anyio.run(seed_http, tgts, seed, run_id, lambda k, task=seed_task: progress.advance(task, k))
                entry["seed_s"] = time.perf_counter() - t0
                for n in cfg.clients:
                    row = anyio.run(run_clients, tgts, seed, texts, cfg.semantic, n, cfg.seconds, run_id, progress)
                    entry["runs"].append(row)
                    finish(result)
                    write_results(cfg.out, result)  # what has finished so far survives an interrupt
    finish(result)
    write_results(cfg.out, result)
    return result


def finish(result: dict[str, Any]) -> None:
    """The baseline's rows (``runs``, ``seed_s``), its floor ratios and the side-by-side comparison."""
    base = result["configs"][0]
    result["runs"], result["seed_s"] = base["runs"], base.get("seed_s")
    result["ratios"] = compute_ratios(result["runs"], result["floor"])
    if len(result["configs"]) > 1:
        result["comparison"] = compare_configs(result["configs"])


def write_results(out: Path, result: Mapping[str, Any]) -> None:
    (out / "bench-http.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "bench-http.md").write_text(markdown(result))


def bench_http_cmd(
    out: Annotated[Path, Opt("--out", help="Output dir: bench-http.json, bench-http.md, server.stderr.",
                             file_okay=False)],
    clients: Annotated[str, Opt("--clients", help="Concurrent client counts, comma-separated.")] = "1,4,16",
    seconds: Annotated[float, Opt("--seconds", min=1, help="Timed seconds per client count.")] = 20.0,
    records: Annotated[int, Opt("--records", min=TENANTS, help="Seed records (capture + admission over HTTP), "
                                "spread over the tenants.")] = 200,
    semantic: Annotated[bool, Opt("--semantic/--no-semantic", help="Hybrid search with the embedding model "
                                  "(the server loads it; searches demand both channels) or lexical only.")] = False,
    url: Annotated[str | None, Opt("--url", help="Bench a running server at this /mcp URL instead of starting "
                                   "one (needs --host-keys, --key and --token-file).")] = None,
    host_keys: Annotated[Path | None, Opt("--host-keys", help="That server's host-keys.toml (server_id, kid).")] = None,
    key: Annotated[Path | None, Opt("--key", help="The host's private key (NAME.private.pem).")] = None,
    token_file: Annotated[Path | None, Opt("--token-file", help="The host's bearer token file (NAME.token).")] = None,
    progress: Annotated[bool, Opt("--progress/--no-progress", help="Progress bars on stderr.")] = True,
    store: Annotated[str | None, Opt("--store", help="Also bench PostgreSQL: a libpq URL (no password) of a role "
                                     "that may CREATE DATABASE. After one node on DuckDB, each --nodes count runs "
                                     "on a fresh database (admin init-store), same load, compared side by side.")
                     ] = None,
    nodes: Annotated[str, Opt("--nodes", help="PostgreSQL node counts, comma-separated (with --store); clients "
                              "spread over the nodes.")] = "1,2",
) -> None:
    """Concurrent signing hosts against the real HTTP server: calls/s, p50/p99 per tool, errors."""
    try:
        counts = parse_clients(clients)
        node_counts = parse_nodes(nodes)
        if store is not None and url is not None:
            raise UsageError("--store and --url exclude each other (--store: the bench starts its nodes itself)")
        if store is None and nodes != "1,2":
            raise UsageError("--nodes needs --store URL (a DuckDB store is served by one process)")
        if store is not None:
            check_admin_url(store)
        external = (url, host_keys, key, token_file)
        if any(v is not None for v in external) and not all(v is not None for v in external):
            raise UsageError("--url, --host-keys, --key and --token-file go together (or none: the bench starts "
                             "its own server)")
        if url is not None and not url.startswith(("http://", "https://")):
            raise UsageError(f"--url must be an http(s) URL ending in /mcp, not {url!r}")
        cfg = BenchConfig(counts, seconds, out, records, semantic, url, host_keys, key, token_file, progress,
                          store, node_counts)
        if url is not None:
            assert host_keys and key and token_file
            external_target(url, host_keys, key, token_file)  # a bad key file is a usage error, before any work
        result = run_bench_http(cfg, sys.argv[2:] if len(sys.argv) > 2 else [])
    except UsageError as exc:
        sys.stderr.write(f"engram-memory: error: {exc}\n")
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        sys.stderr.write(f"engram-memory: bench-http interrupted; counts finished so far are in "
                         f"{out / 'bench-http.json'}\n")
        raise typer.Exit(130) from None
    render(result)
    sys.stderr.write(f"wrote {out / 'bench-http.json'} and bench-http.md\n")
