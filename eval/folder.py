"""``engram-memory eval --dataset DIR`` where DIR is a folder of collections (e.g. ``data/locomo``).

Each collection is evaluated on its own, exactly as a single ``--dataset`` would be (its own scope,
its own store, its own ``OUT/<name>/`` with results.json, report.md and runs), then this module
writes the folder's summary: ``OUT/results.json`` with every collection's scores and the mean over
collections (macro: each collection counts once, as LoCoMo results are reported), ``OUT/report.md``
with one table per headline metric, and ``OUT/report.png``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engram_memory.eval.beir import Collection
from engram_memory.eval.metrics import METRICS
from engram_memory.eval.report import write_results

HEADLINE = ("ndcg@10", "recall@10", "recall@100")
MEAN = "mean"


def mean_scores(per_collection: Sequence[Mapping[str, Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """``{run: {metric: mean}}`` over the collections that have that run (every one, in practice)."""
    out: dict[str, dict[str, float]] = {}
    names = list(dict.fromkeys(name for runs in per_collection for name in runs))
    for name in names:
        rows = [runs[name] for runs in per_collection if name in runs]
        out[name] = {m: sum(r[m] for r in rows) / len(rows) for m in METRICS if all(m in r for r in rows)}
    return out


def columns(result: Mapping[str, Any]) -> dict[str, Mapping[str, float]]:
    """One collection's runs as report columns: ours, then the peer's as ``lancedb <run>``."""
    cols: dict[str, Mapping[str, float]] = dict(result["runs"])
    peer = result.get("peer") or {}
    for name, scores in (peer.get("runs") or {}).items():
        cols[f"{peer['name']} {name}"] = scores
    return cols


def summary(folder: Path, results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The folder's results.json: per-collection scores and the mean row."""
    per = {name: columns(r) for name, r in results.items()}
    first = next(iter(results.values()))
    return {
        "dataset": folder.name,
        "folder": str(folder),
        "collections": list(results),
        "mean_over": "collections (each counts once)",
        "per_collection": {name: {"docs": r["docs"], "queries": r["queries"], "runs": per[name],
                                  "results": f"{name}/results.json"} for name, r in results.items()},
        "mean": mean_scores(list(per.values())),
        "queries": sum(r["queries"] for r in results.values()),
        "docs": sum(r["docs"] for r in results.values()),
        "fusion": first.get("fusion"),
        "model": first.get("model"),
        "mapping": first.get("mapping"),
        "limit_docs": first.get("limit_docs"),
        "max_queries": first.get("max_queries"),
        "baseline": first.get("baseline"),
    }


def markdown(s: Mapping[str, Any]) -> str:
    names = list(s["mean"])
    lines = [f"# Relevance: {s['dataset']} ({len(s['collections'])} collections)", "",
             f"Each collection is evaluated in its own scope (its own store); `{MEAN}` is the mean over the "
             f"{len(s['collections'])} collections, each counting once. {s['queries']:,} judged queries, "
             f"{s['docs']:,} documents in all. Fusion: `{json.dumps(s['fusion'])}`; mapping: `{s['mapping']}`."]
    if s.get("baseline"):
        b = s["baseline"]
        lines += ["", f"`baseline` is standard BM25 ({b['engine']} {b['engine_version']}, {b['stemmer']}, "
                  f"{b['stopwords']} stopwords, k1 {b['k1']}, b {b['b']}, {b['fields']})."]
    for metric in HEADLINE:
        lines += ["", f"## {metric}", "", "| collection | " + " | ".join(names) + " |",
                  "|---|" + "---:|" * len(names)]
        for coll, row in s["per_collection"].items():
            lines.append(f"| {coll} | " + " | ".join(_cell(row["runs"].get(n, {}).get(metric)) for n in names) + " |")
        lines.append(f"| **{MEAN}** | " + " | ".join(f"**{_cell(s['mean'][n].get(metric))}**" for n in names) + " |")
    lines += ["", "Per collection: `<name>/report.md` and `<name>/results.json` (all metrics, receipts, latency).",
              ""]
    return "\n".join(lines)


def _cell(x: float | None) -> str:
    return "—" if x is None else f"{x:.4f}"


def plot(path: Path, s: Mapping[str, Any], metric: str = "ndcg@10") -> None:
    """Grouped bars: one group per collection and the mean, one bar per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [*s["per_collection"], MEAN]
    names = list(s["mean"])
    fig, ax = plt.subplots(figsize=(max(7, 1.3 * len(groups) + 3), 5), dpi=110)
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        vals = [(s["mean"][name] if g == MEAN else s["per_collection"][g]["runs"].get(name, {})).get(metric, 0.0)
                for g in groups]
        bars = ax.bar([j + i * width for j in range(len(groups))], vals, width, label=name)
        ax.bar_label(bars, fmt="%.3f", fontsize=6, rotation=90, padding=2)
    ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(groups))], groups, fontsize=8)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel(metric)
    ax.set_title(f"{s['dataset']}: {metric} per collection")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncols=4, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run_folder(folder: Path, cols: Sequence[Collection], out: Path, **run_options: Any) -> dict[str, Any]:
    """Evaluate each collection into ``out/<name>`` (harness.run_eval), then write the summary."""
    from engram_memory.eval.harness import run_eval

    results = {col.name: run_eval(col, out / col.name, **run_options) for col in cols}
    s = summary(folder, results)
    write_results(out, s)
    (out / "report.md").write_text(markdown(s), encoding="utf-8")
    plot(out / "report.png", s)
    return s
