"""Write ``results.json``, ``report.md`` and ``report.png`` for one eval run."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engram_memory.eval.metrics import METRICS


def write_results(out: Path, results: Mapping[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    path.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path


def _fmt(x: float | None, digits: int = 4) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def metrics_table(runs: Mapping[str, Mapping[str, float]], metrics: tuple[str, ...] = METRICS) -> list[str]:
    lines = ["| run | " + " | ".join(metrics) + " |", "|---|" + "---:|" * len(metrics)]
    for name, scores in runs.items():
        lines.append(f"| {name} | " + " | ".join(_fmt(scores.get(m)) for m in metrics) + " |")
    return lines


def _model(model: Mapping[str, Any]) -> str:
    if not model.get("model_id"):
        return "model: not loaded (no semantic run)"
    return f"model: `{model['model_id']}` (digest `{str(model['model_digest'])[:19]}…`)"


def markdown(results: Mapping[str, Any]) -> str:
    r = results
    admitted = ("" if r.get("admitted") is None else
                f" ({r['admitted']:,} admitted, {len(r['rejected'])} refused by the admission policy)")
    lines = [
        f"# Relevance: {r['dataset']}",
        "",
        f"{r['docs']:,} documents{admitted}, {r['queries']:,} judged test queries"
        + (f", subset of the first-judged docs (--limit-docs {r['limit_docs']})" if r.get("limit_docs") else "")
        + ".",
        f"Fusion: `{json.dumps(r['fusion'])}`; {_model(r['model'])}; mapping: `{r['mapping']}`.",
        "",
        *metrics_table(r["runs"]),
    ]
    base = r.get("baseline")
    if base:
        lines += ["", f"`baseline` is standard BM25, not the engine: {base['engine']} {base['engine_version']}, "
                  f"{base['stemmer']} stemming, {base['stopwords']} stopwords, k1 {base['k1']}, b {base['b']}, "
                  f"{base['fields']}, exhaustive top-{base['depth']} (eval/baseline.py)."]
    peer = r.get("peer")
    if peer and peer.get("runs"):
        lines += ["", f"## Peer: {peer['name']} {peer['version']}", "", *metrics_table(peer["runs"])]
        if peer.get("ratios"):
            lines += ["", "Ratios engram / peer (relevance: > 1 is better for engram; latency: < 1 is faster):",
                      "", "| quantity | ratio |", "|---|---:|"]
            lines += [f"| {k} | {_fmt(v, 3)} |" for k, v in peer["ratios"].items()]
    elif peer:
        lines += ["", f"Peer {peer.get('name')}: skipped ({peer.get('skipped')})."]
    lat = r.get("latency_ms")
    if lat:
        lines += ["", "## Search latency (ms): one search per query at limit 10, real search path incl. query encode, "
                  "packets and receipts", "",
                  "| run | p50 | p95 | p99 |", "|---|---:|---:|---:|"]
        lines += [f"| {k} | {_fmt(v['p50'], 1)} | {_fmt(v['p95'], 1)} | {_fmt(v['p99'], 1)} |" for k, v in lat.items()]
    sig = r.get("significance")
    if sig:
        lines += ["", "Paired t-test p-values on nDCG@10 (ranx.compare):", ""]
        lines += [f"- {a} vs {b}: p = {v:.3g}" for a, row in sig.items() for b, v in row.items()]
    lines += ["", "Metrics: ranx " + r.get("ranx_version", "") + "; the engine's runs are its rank receipts "
              "(two pages of 50 via next_page_cursor), scored in the engine's order.", ""]
    return "\n".join(lines)


def write_report(out: Path, results: Mapping[str, Any]) -> None:
    (out / "report.md").write_text(markdown(results), encoding="utf-8")
    plot(out / "report.png", results)


def plot(path: Path, results: Mapping[str, Any]) -> None:
    """Grouped bars: one group per metric, one bar per run (engram runs, then peer runs)."""
    import matplotlib

    matplotlib.use("Agg")  # headless: never needs a display
    import matplotlib.pyplot as plt

    runs: dict[str, Mapping[str, float]] = {(k if k == "baseline" else f"engram {k}"): v
                                            for k, v in results["runs"].items()}
    peer = results.get("peer") or {}
    runs.update({f"{peer['name']} {k}": v for k, v in (peer.get("runs") or {}).items()})
    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    width = 0.8 / max(1, len(runs))
    for i, (name, scores) in enumerate(runs.items()):
        xs = [j + i * width for j in range(len(METRICS))]
        bars = ax.bar(xs, [scores.get(m, 0.0) for m in METRICS], width, label=name)
        ax.bar_label(bars, fmt="%.3f", fontsize=6, rotation=90, padding=2)
    ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(METRICS))], METRICS)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("score")
    ax.set_title(f"{results['dataset']}: {results['docs']:,} docs, {results['queries']:,} queries")
    # below the axes: inside, it hides the first group's value labels
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncols=3, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
