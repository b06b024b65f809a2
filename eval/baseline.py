"""The ``baseline`` row: standard BM25 (bm25s) over the same collection, in the same run.

"Standard BM25" as issue 12 and ``../shared/data/README.md`` define it, the reference users know:
bm25s 0.3.16, PyStemmer English (Snowball) stemming, bm25s' English stopwords, k1 0.9, b 0.4
(Lucene's BM25 variant, bm25s' default), title and text as one field (``title + " " + text``), and an
exhaustive top-1000 (every document is scored; no pruning). Query terms are counted with their
repeats, as bm25s does.

Scores are bm25s' own (``get_scores``); the order among equal scores is the corpus order, ours.
bm25s' ``retrieve`` breaks ties with numpy's argpartition + argsort, whose order depends on the
CPU's sort kernel: on an AVX-512 machine LoCoMo-30 reads 0.5124, on the AVX2 machine that measured
the README 0.517. Corpus order reproduces the README's figures to 3 decimals on Medline, Cranfield,
SciFact, LoCoMo-26, -30 and -43, and within 0.001 on LoCoMo-41 (0.4997 for 0.501) and -42 (0.4737
for 0.473), the same on every machine. One choice of ours: documents with score 0 (no query term)
are not returned -- they are not matches, and their order is arbitrary.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import numpy as np

from engram_memory.eval.beir import Collection, Doc

K1 = 0.9
B = 0.4
DEPTH = 1000
STOPWORDS = "en"
STEMMER = "english"
BASELINE_EXTRA = ("bm25s", "Stemmer")  # import names (PyStemmer installs as Stemmer)


def describe() -> dict[str, Any]:
    """What a results file says about the baseline run (enough to re-derive it)."""
    return {"engine": "bm25s", "engine_version": version("bm25s"), "stemmer": f"PyStemmer {version('PyStemmer')} "
            f"{STEMMER}", "stopwords": f"bm25s {STOPWORDS}", "k1": K1, "b": B, "method": "lucene",
            "fields": "title + ' ' + text, one field", "depth": DEPTH, "query_terms": "with repeats"}


def doc_field(doc: Doc) -> str:
    """Title and text as one field (Medline has no titles: the text alone)."""
    return f"{doc.title} {doc.text}" if doc.title else doc.text


@dataclass
class Bm25sIndex:
    """A bm25s index over ``texts``, scored exhaustively; ``ids`` are the documents in the same order."""

    ids: list[str]
    retriever: Any
    stemmer: Any
    stopwords: str | list[str] | None
    lower: bool = True
    token_pattern: str = r"(?u)\b\w\w+\b"

    @classmethod
    def build(cls, ids: Sequence[str], texts: Sequence[str], k1: float = K1, b: float = B,
              stopwords: str | list[str] | None = STOPWORDS, stemmer: str | None = STEMMER,
              method: str = "lucene", token_pattern: str = r"(?u)\b\w\w+\b") -> Bm25sIndex:
        import bm25s
        import Stemmer

        stem = Stemmer.Stemmer(stemmer) if stemmer else None
        tokens = bm25s.tokenize(list(texts), stopwords=stopwords or [], stemmer=stem, show_progress=False,
                                token_pattern=token_pattern)
        retriever = bm25s.BM25(k1=k1, b=b, method=method, backend="numpy")
        retriever.index(tokens, show_progress=False)
        return cls(list(ids), retriever, stem, stopwords, token_pattern=token_pattern)

    def tokens(self, query: str) -> list[str]:
        import bm25s

        out = bm25s.tokenize([query], stopwords=self.stopwords or [], stemmer=self.stemmer, return_ids=False,
                             show_progress=False, token_pattern=self.token_pattern)
        return [t for t in out[0] if t]

    def scores(self, terms: Sequence[str]) -> np.ndarray:
        known = [t for t in terms if t in self.retriever.vocab_dict]
        if not known:
            return np.zeros(len(self.ids), dtype=np.float64)
        return np.asarray(self.retriever.get_scores(known), dtype=np.float64)

    def search_terms(self, terms: Sequence[str], depth: int = DEPTH,
                     tie: np.ndarray | None = None) -> list[tuple[str, float]]:
        """The top ``depth`` documents with a score > 0, by (-score, ``tie`` rank or corpus order).

        Corpus order is the baseline's own (``search``); studies/lexical_study.py passes another ``tie``
        for runs it compares with each other."""
        s = self.scores(terms)
        hits = np.flatnonzero(s > 0)
        second = hits if tie is None else tie[hits]
        order = hits[np.lexsort((second, -s[hits]))][:depth]  # lexsort: the last key is the primary one
        return [(self.ids[i], float(s[i])) for i in order]

    def search(self, query: str, depth: int = DEPTH) -> list[tuple[str, float]]:
        """The top ``depth`` by (-score, corpus order), without the documents that score 0."""
        return self.search_terms(self.tokens(query), depth)


def unavailable() -> str | None:
    """Why the baseline cannot run here (None: it can)."""
    import importlib.util

    missing = [name for name in BASELINE_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        return (f"the baseline needs {', '.join('PyStemmer' if m == 'Stemmer' else m for m in missing)}; install "
                "it with: pip install 'engram-memory[eval]' (from a clone: pip install -e '.[eval]')")
    return None


def run(docs: Iterable[Doc], queries: Mapping[str, str], depth: int = DEPTH) -> dict[str, list[tuple[str, float]]]:
    """The baseline run of every query (``qid -> [(doc_id, bm25)]``)."""
    docs = list(docs)
    index = Bm25sIndex.build([d.doc_id for d in docs], [doc_field(d) for d in docs])
    return {qid: index.search(text, depth) for qid, text in queries.items()}


def run_collection(col: Collection, depth: int = DEPTH) -> dict[str, list[tuple[str, float]]]:
    return run(col.docs, col.queries, depth)
