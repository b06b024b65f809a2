"""What text of a short conversational record to index and embed (issue 12 item 3): a measured study.

    python -m studies.memory_study [--data ../shared/data/locomo] [--out studies]

A LoCoMo record is one dialogue turn: ``text`` = "Speaker: words" (plus a shared photo's
caption), ``title`` = the session number and date. The ``single`` eval mapping (what an agent
that stores a turn verbatim does) indexes and embeds ``title + "\\n" + text``. This study scores,
per conversation and as the mean, variants of what the record carries:

* embedding text: the turn alone, with its date, with the previous turn (and the next one);
* lexical document: the same, with the turn as the ``primary`` field and its neighbours in the
  lower-weighted ``context`` field (as a capture with a ``context`` component would index them).

The channels are the engine's own: retrieval/lexical.py's :class:`LexicalIndex` (analyzer, fields,
weights, query) in a temporary directory, the packaged model through retrieval/embedder.py, exact
cosine as the vector index ranks below its HNSW threshold, and retrieval/ranking.py's ``rank`` with
the engine's default fusion and semantic floor for the hybrid. Every run is top-1000 and breaks ties on the
record. Output: ``OUT/memory-study.md`` and ``OUT/memory-study.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from engram_memory.eval import metrics
from engram_memory.eval.beir import Collection, Doc, collection_folders, load_collection

DEPTH = 1000
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "locomo"
Run = dict[str, list[tuple[str, float]]]
_TURN = re.compile(r"^D(\d+):(\d+)$")


def neighbours(col: Collection) -> dict[str, tuple[Doc | None, Doc | None]]:
    """``{doc_id: (previous turn, next turn)}`` within the same session (None at its edges)."""
    by_session: dict[int, list[tuple[int, Doc]]] = {}
    for doc in col.docs:
        m = _TURN.match(doc.doc_id)
        if m:
            by_session.setdefault(int(m.group(1)), []).append((int(m.group(2)), doc))
    out: dict[str, tuple[Doc | None, Doc | None]] = {}
    for turns in by_session.values():
        turns.sort(key=lambda t: t[0])
        for i, (_n, doc) in enumerate(turns):
            out[doc.doc_id] = (turns[i - 1][1] if i else None, turns[i + 1][1] if i + 1 < len(turns) else None)
    return out


Shape = Callable[[Doc, Doc | None, Doc | None], str]


def _join(*parts: str | None) -> str:
    return "\n".join(p for p in parts if p)


def _text(d: Doc | None) -> str | None:
    return d.text if d is not None else None


EMBED: dict[str, Shape] = {
    "title + turn (now)": lambda d, p, n: _join(d.title, d.text),
    "turn": lambda d, p, n: d.text,
    "turn + date": lambda d, p, n: _join(d.text, d.title),
    "previous + turn": lambda d, p, n: _join(_text(p), d.text),
    "turn + next": lambda d, p, n: _join(d.text, _text(n)),
    "previous + turn + next": lambda d, p, n: _join(_text(p), d.text, _text(n)),
    "title + previous + turn": lambda d, p, n: _join(d.title, _text(p), d.text),
}
# Lexical documents as the engine's fields: (primary, context).
LEXICAL: dict[str, Callable[[Doc, Doc | None, Doc | None], tuple[str, str]]] = {
    "title + turn (now)": lambda d, p, n: (_join(d.title, d.text),) * 2,  # type: ignore[return-value]
    "turn": lambda d, p, n: (d.text, d.text),
    "turn; context: previous": lambda d, p, n: (d.text, _join(_text(p), d.text)),
    "turn; context: previous + next": lambda d, p, n: (d.text, _join(_text(p), d.text, _text(n))),
    "turn; context: title + previous": lambda d, p, n: (d.text, _join(d.title, _text(p), d.text)),
}


def lexical_run(col: Collection, shape: Callable[..., tuple[str, str]], work: Path) -> Run:
    from engram_memory.retrieval.lexical import LexicalDoc, LexicalIndex

    near = neighbours(col)
    with tempfile.TemporaryDirectory(dir=work) as tmp, LexicalIndex.open(Path(tmp)) as index:
        docs = []
        for doc in sorted(col.docs, key=lambda d: d.doc_id):
            primary, context = shape(doc, *near.get(doc.doc_id, (None, None)))
            docs.append(LexicalDoc(doc.doc_id, {"primary": primary, "context": context,
                                                "citations": f"beir:{col.name}:{doc.doc_id}"}))
        index.upsert(docs)
        return {qid: index.search(text, DEPTH) for qid, text in col.queries.items()}


class Vectors:
    """Exact cosine over L2-normalised rows, ranked by (-cosine, id) like retrieval/vectors.py."""

    def __init__(self, embedder: Any, cache: dict[str, np.ndarray]) -> None:
        self.embedder = embedder
        self.cache = cache

    def encode(self, texts: list[str]) -> np.ndarray:
        todo = sorted({t for t in texts if t not in self.cache})
        for start in range(0, len(todo), 256):
            chunk = todo[start:start + 256]
            for t, v in zip(chunk, self.embedder.encode(chunk), strict=True):
                self.cache[t] = v
        return np.stack([self.cache[t] for t in texts]) if texts else np.zeros((0, self.embedder.dim or 0), np.float32)

    def run(self, col: Collection, shape: Shape, qvecs: np.ndarray) -> Run:
        near = neighbours(col)
        docs = sorted(col.docs, key=lambda d: d.doc_id)
        mat = self.encode([shape(d, *near.get(d.doc_id, (None, None))) for d in docs])
        ids = [d.doc_id for d in docs]
        out: Run = {}
        for qid, q in zip(col.queries, qvecs, strict=True):
            scores = mat @ q
            ranked = sorted(zip(ids, (float(s) for s in scores), strict=True), key=lambda x: (-x[1], x[0]))
            out[qid] = ranked[:DEPTH]
        return out


def hybrid(lex: Run, sem: Run) -> Run:
    """The engine's own ranking step (retrieval/ranking.py): its default fusion, then its floor."""
    from engram_memory.retrieval.ranking import FusionConfig, rank

    config = FusionConfig()
    return {qid: rank({"lexical": lex.get(qid, []), "semantic": sem[qid]}, config).fused[:DEPTH] for qid in sem}


def study_setup(doc: str, prog: str, argv: list[str] | None) -> tuple[argparse.Namespace, Any] | None:
    """A LoCoMo study's command line (``--data``, ``--out``) and the loaded packaged model.

    None, with one line on stderr, when the model did not load.
    """
    ap = argparse.ArgumentParser(prog=prog, description=doc.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="a folder of LoCoMo collections")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = ap.parse_args(argv)
    from engram_memory.retrieval.embedder import Embedder

    embedder = Embedder(threads=None).start()
    if not embedder.wait(600):
        print(f"{prog}: the embedding model did not load: {embedder.error}", file=sys.stderr)
        return None
    return args, embedder


def main(argv: list[str] | None = None) -> int:
    setup = study_setup(__doc__ or "", "memory_study", argv)
    if setup is None:
        return 1
    args, embedder = setup
    vectors = Vectors(embedder, {})
    args.out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict[str, dict[str, float]]] = {}
    t0 = time.perf_counter()
    for folder in collection_folders(args.data):
        col = load_collection(folder)
        qids = list(col.queries)
        qvecs = vectors.encode([col.queries[q] for q in qids])
        lex = {name: lexical_run(col, shape, args.out) for name, shape in LEXICAL.items()}
        sem = {name: vectors.run(col, shape, qvecs) for name, shape in EMBED.items()}

        def put(label: str, run: Run, _col: Collection = col) -> None:
            rows.setdefault(label, {})[_col.name] = metrics.score(run, _col.qrels, ("ndcg@10", "recall@10"))

        for name, run in lex.items():
            put(f"lexical | {name}", run)
        for name, run in sem.items():
            put(f"semantic | {name}", run)
        for lname, lrun in lex.items():
            for sname, srun in sem.items():
                put(f"hybrid | {lname} ‖ {sname}", hybrid(lrun, srun))
        print(f"memory_study: {col.name} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    names = sorted({c for r in rows.values() for c in r})
    for r in rows.values():
        r["mean"] = {m: float(np.mean([r[c][m] for c in names])) for m in ("ndcg@10", "recall@10")}
    (args.out / "memory-study.json").write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    lines = ["| run | " + " | ".join(names) + " | mean nDCG@10 | mean R@10 |",
             "|---|" + "---:|" * (len(names) + 2)]
    for label, r in sorted(rows.items(), key=lambda kv: -kv[1]["mean"]["ndcg@10"]):
        cells = " | ".join(f"{r[c]['ndcg@10']:.4f}" for c in names)
        lines.append(f"| {label} | {cells} | **{r['mean']['ndcg@10']:.4f}** | {r['mean']['recall@10']:.4f} |")
    (args.out / "memory-study.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
