"""Scoring with ranx (a maintained library; no hand-written metrics) and TREC run files."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

from ranx import Qrels, Run, compare, evaluate

# numba's uint64 -> int64 cast notice on every ndcg call: noise for ranks < 2**63
warnings.filterwarnings("ignore", message="unsafe cast from uint64 to int64")

# recall@10: what a default page (limit 10) holds -- the figure issue 12 asks of LoCoMo.
METRICS: tuple[str, ...] = ("ndcg@10", "recall@10", "recall@100", "mrr@10", "map@100")
Ranking = Sequence[tuple[str, float]]  # (doc_id, engine score), in the engine's order


def _qrels(qrels: Mapping[str, Mapping[str, int]]) -> Qrels:
    return Qrels({q: dict(d) for q, d in qrels.items()})


def _run(run: Mapping[str, Ranking], qrels: Mapping[str, Mapping[str, int]], name: str) -> Run:
    """A ranx Run that scores the engine's *order*, not its raw scores.

    ranx re-sorts by score and breaks ties its own way; the engine breaks ties on record_id.
    Scoring ``depth - position`` keeps exactly the engine's ranking. Queries without any hit
    get an empty entry so they count as zeros instead of being dropped.
    """
    out: dict[str, dict[str, float]] = {}
    for qid in qrels:
        hits = list(run.get(qid, ()))
        out[qid] = {doc: float(len(hits) - i) for i, (doc, _s) in enumerate(hits)}
    return Run(out, name=name)


def score(run: Mapping[str, Ranking], qrels: Mapping[str, Mapping[str, int]],
          metrics: Sequence[str] = METRICS) -> dict[str, float]:
    """``{metric: mean over judged queries}``; ranx's ``@k`` cuts at k."""
    built = _run(run, qrels, "run")
    result = evaluate(_qrels(qrels), built, list(metrics), make_comparable=True)
    if isinstance(result, float):
        result = {metrics[0]: result}
    return {m: float(result[m]) for m in metrics}


def per_query(run: Mapping[str, Ranking], qrels: Mapping[str, Mapping[str, int]], metric: str) -> dict[str, float]:
    built = _run(run, qrels, "run")
    evaluate(_qrels(qrels), built, [metric], make_comparable=True, return_mean=False)
    return {q: float(v) for q, v in built.scores[metric].items()}


def significance(runs: Mapping[str, Mapping[str, Ranking]], qrels: Mapping[str, Mapping[str, int]],
                 metric: str = "ndcg@10") -> dict[str, dict[str, float]]:
    """Two-sided paired t-test p-values of every run against every other (ranx.compare)."""
    names = list(runs)
    report = compare(_qrels(qrels), [_run(runs[n], qrels, n) for n in names], metrics=[metric],
                     stat_test="student", make_comparable=True)
    out: dict[str, dict[str, float]] = {}
    for a in names:
        for b in names:
            if a != b:
                out.setdefault(a, {})[b] = float(report.comparisons[frozenset((a, b))][metric]["p_value"])
    return out


def write_trec(path: Path, run: Mapping[str, Ranking], tag: str) -> None:
    """``qid Q0 docid rank score tag``: rank is the engine's rank, score its fused score."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for qid in sorted(run):
            for i, (doc, s) in enumerate(run[qid], start=1):
                fh.write(f"{qid} Q0 {doc} {i} {s:.9g} {tag}\n")
