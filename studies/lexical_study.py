"""Why the lexical channel loses to standard BM25 (issue 12 item 1): a measured study, lexical only.

    python -m studies.lexical_study [--data ../shared/data] [--out studies]

On every development collection (scifact, cranfield, medline and each LoCoMo conversation) it
scores, by nDCG@10 (and Recall@10/100 in the JSON):

* ``bm25s`` -- the ``baseline`` row of ``engram-memory eval`` (eval/baseline.py), and the same run
  with ties broken on the document id like every other run here (the tie noise);
* ``lexical now`` -- the channel as it is: retrieval/lexical.py's own :class:`LexicalIndex` (its
  analyzer, its five-field schema and weights, ``query_terms`` and ``max_query_terms``), fed the
  fields the engine derives from an eval capture (store/core/lifecycle.py ``lexical_fields``): with the
  ``single`` mapping ``primary`` and ``context`` both hold title + text, ``citations`` the
  ``beir:<collection>:<doc id>`` source ref;
* Tantivy variants that change one factor of "lexical v1" (the channel before stop words) at a
  time (stopwords, stemming,
  tokenization, fields and weights, query construction), built in-process with tantivy-py the way
  LexicalIndex builds its index and query;
* bm25s variants that separate the one factor Tantivy cannot change -- its BM25 k1/b, fixed at
  1.2/0.75 -- from the rest;
* combinations, to find the change worth proposing for retrieval/lexical.py.

Every run is exhaustive top-1000 and breaks ties on the document id, so runs differ only by their
factor. Nothing here changes retrieval/ or a server default: it measures. Output:
``OUT/lexical-study.md`` (collections x variants) and ``OUT/lexical-study.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engram_memory.eval import baseline, metrics
from engram_memory.eval.beir import Collection, Doc, collection_folders, load_collection
from engram_memory.retrieval.lexical import STOPWORDS

DEPTH = 1000
METRICS = ("ndcg@10", "recall@10", "recall@100")
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
Run = dict[str, list[tuple[str, float]]]


# -- Tantivy, configurable (mirrors retrieval/lexical.py: one boosted term clause per field and term) --


@dataclass(frozen=True)
class TantivySetup:
    """One Tantivy configuration. The defaults are retrieval/lexical.py's (analyzer, weights, query)."""

    tokenizer: str = "simple"  # "simple" (tantivy's, keeps 1-char tokens) or a regex such as r"\w\w+"
    stopwords: tuple[str, ...] = ()
    stem: bool = True
    # "engine": the fields lexical_fields() fills for the eval capture (see fields_for);
    # "one": title + " " + text in one field; "split": the engine's fields for the split mapping.
    fields: str = "engine"
    citations: bool = True
    weights: Mapping[str, float] = field(default_factory=lambda: {"primary": 3.0, "decision": 2.0, "evidence": 1.5,
                                                                  "context": 1.0, "citations": 0.5})
    repeats: bool = False  # False: distinct query terms (query_terms); True: a term counts per occurrence
    max_query_terms: int = 1024
    # query-term weight from its count c when ``repeats``: "count" (c, as bm25s), "log" (1 + ln c), "sqrt"
    qtf: str = "count"

    def analyzer(self) -> Any:
        import tantivy

        tok = tantivy.Tokenizer.simple() if self.tokenizer == "simple" else tantivy.Tokenizer.regex(self.tokenizer)
        builder = tantivy.TextAnalyzerBuilder(tok).filter(tantivy.Filter.remove_long(40)) \
            .filter(tantivy.Filter.lowercase())
        if self.stopwords:
            builder = builder.filter(tantivy.Filter.custom_stopword(list(self.stopwords)))
        if self.stem:
            builder = builder.filter(tantivy.Filter.stemmer("english"))
        return builder.build()


def engine_fields(collection: str, doc: Doc, mapping: str = "single") -> dict[str, str]:
    """The lexical document the engine indexes for an eval capture (eval.ingest + lifecycle.lexical_fields)."""
    from engram_memory.eval.ingest import doc_text

    body = doc_text(doc) or doc.doc_id
    cite = f"beir:{collection}:{doc.doc_id}"
    if mapping == "split" and doc.title and doc.text:
        return {"primary": doc.title, "context": f"{doc.title}\n{doc.text}", "citations": cite}
    return {"primary": body, "context": body, "citations": cite}


def fields_for(setup: TantivySetup, collection: str, doc: Doc) -> dict[str, str]:
    if setup.fields == "one":
        return {"context": baseline.doc_field(doc)}
    out = engine_fields(collection, doc, "split" if setup.fields == "split" else "single")
    if not setup.citations:
        out.pop("citations")
    return out


class TantivyRun:
    """A RAM Tantivy index of one collection under one setup; ``search`` mirrors LexicalIndex.search."""

    FIELDS = ("primary", "decision", "evidence", "context", "citations")

    def __init__(self, setup: TantivySetup, col: Collection) -> None:
        import tantivy

        self.setup = setup
        self.analyzer = setup.analyzer()
        sb = tantivy.SchemaBuilder()
        sb.add_text_field("id", stored=True, tokenizer_name="raw", index_option="basic")
        for name in self.FIELDS:
            sb.add_text_field(name, stored=False, tokenizer_name="study", index_option="freq")
        self.schema = sb.build()
        self.index = tantivy.Index(self.schema)
        self.index.register_tokenizer("study", setup.analyzer())
        writer = self.index.writer(50_000_000, 1)
        for doc in sorted(col.docs, key=lambda d: d.doc_id):  # LexicalIndex adds in id order
            writer.add_document(tantivy.Document(id=doc.doc_id, **{k: v for k, v in
                                                                   fields_for(setup, col.name, doc).items() if v}))
        writer.commit()
        writer.wait_merging_threads()
        self.index.reload()
        self.searcher = self.index.searcher()
        self.total = int(self.searcher.num_docs)

    def terms(self, text: str) -> Counter[str]:
        """query_terms(): the first ``max_query_terms`` distinct tokens (with their counts if ``repeats``)."""
        counts: Counter[str] = Counter()
        for token in self.analyzer.analyze(text):
            if token not in counts and len(counts) >= self.setup.max_query_terms:
                continue
            counts[token] += 1
        if not self.setup.repeats:
            return Counter(dict.fromkeys(counts, 1))
        weigh = {"count": float, "log": lambda c: 1.0 + math.log(c), "sqrt": math.sqrt}[self.setup.qtf]
        return Counter({t: weigh(c) for t, c in counts.items()})

    def search(self, text: str, depth: int = DEPTH) -> list[tuple[str, float]]:
        import tantivy

        terms = self.terms(text)
        if not terms:
            return []
        weights = {f: w for f, w in self.setup.weights.items() if w > 0}
        clauses = [(tantivy.Occur.Should, tantivy.Query.boost_query(
            tantivy.Query.term_query(self.schema, name, term, index_option="freq"), weight * count))
            for name, weight in weights.items() for term, count in sorted(terms.items())]
        query = tantivy.Query.boolean_query(clauses)
        fetch = min(depth + 1, self.total)
        while True:  # as LexicalIndex.search: widen until the hit after the cut scores strictly lower
            hits = self.searcher.search(query, limit=fetch, count=False).hits
            if len(hits) < fetch or fetch >= self.total or hits[depth - 1][0] > hits[-1][0]:
                break
            fetch = min(fetch * 2, self.total)
        ranked = sorted(((self.searcher.doc(addr)["id"][0], float(score)) for score, addr in hits),
                        key=lambda h: (-h[1], h[0]))
        return ranked[:depth]


def lexical_now(col: Collection, depth: int = DEPTH) -> tuple[Run, dict[str, Any]]:
    """The channel as shipped: retrieval/lexical.py's LexicalIndex over the engine's fields."""
    from engram_memory.retrieval.lexical import REFERENCE_PROFILE, LexicalDoc, LexicalIndex

    with tempfile.TemporaryDirectory(prefix="lexical-study-") as tmp:
        with LexicalIndex.open(Path(tmp) / "lexical", REFERENCE_PROFILE) as index:
            index.rebuild(LexicalDoc(d.doc_id, engine_fields(col.name, d)) for d in col.docs)
            run = {qid: index.search(text, depth) for qid, text in col.queries.items()}
            described = index.describe()
    return run, described


# -- bm25s variants: the k1/b effect apart from everything else ----------------------------------


TANTIVY_LIKE_TOKENS = r"(?u)[^\W_]+"  # tantivy's simple tokenizer: runs of alphanumerics, 1 char kept


def bm25s_run(col: Collection, k1: float = baseline.K1, b: float = baseline.B, stopwords: Any = baseline.STOPWORDS,
              token_pattern: str = r"(?u)\b\w\w+\b", distinct: bool = False, depth: int = DEPTH) -> Run:
    ids = [d.doc_id for d in col.docs]
    index = baseline.Bm25sIndex.build(ids, [baseline.doc_field(d) for d in col.docs], k1=k1, b=b,
                                      stopwords=stopwords, token_pattern=token_pattern)
    tie = np.argsort(np.argsort(np.asarray(ids, dtype=object)))  # rank of each id: ties on the id, as Tantivy runs
    out: Run = {}
    for qid, text in col.queries.items():
        terms = index.tokens(text)
        if distinct:
            terms = list(dict.fromkeys(terms))
        out[qid] = index.search_terms(terms, depth, tie=tie)
    return out


# -- the variants ---------------------------------------------------------------------------------


def _stop(name: str) -> tuple[str, ...]:
    import bm25s.stopwords as sw

    return tuple(sorted(set({"en": sw.STOPWORDS_EN, "en_plus": sw.STOPWORDS_EN_PLUS}[name])))


@dataclass(frozen=True)
class Variant:
    name: str
    group: str
    what: str
    make: Callable[[Collection], Run]


def _tantivy(setup: TantivySetup) -> Callable[[Collection], Run]:
    def make(col: Collection) -> Run:
        t = TantivyRun(setup, col)
        return {qid: t.search(text) for qid, text in col.queries.items()}
    return make


V1 = TantivySetup()  # the channel before stop words: every "one factor" variant below starts here
NOW = TantivySetup(stopwords=STOPWORDS, repeats=True, qtf="sqrt")  # the shipped channel (retrieval/lexical.py)
BEFORE_QTF = TantivySetup(stopwords=STOPWORDS)  # the channel before issue 24: distinct query terms, weight 1
BM25S_ANALYZER = dict(tokenizer=r"\w\w+", stopwords=_stop("en"))  # bm25s' tokens in Tantivy


def variants() -> list[Variant]:
    en = _stop("en")
    return [
        Variant("bm25s", "reference", "the baseline row: bm25s, its own tie order", baseline.run_collection),
        Variant("bm25s (id ties)", "reference", "the same scores, ties broken on the doc id like every run below",
                lambda c: bm25s_run(c)),
        Variant("lexical now", "reference", "retrieval/lexical.py LexicalIndex over the engine's fields",
                lambda c: lexical_now(c)[0]),
        Variant("study harness = now", "reference", "this script's Tantivy build with the shipped settings "
                "(must equal lexical now)", _tantivy(NOW)),
        Variant("lexical v1", "reference", "the channel before the stop words (tantivy's en_stem analyzer); "
                "the variants below change one factor of it", _tantivy(V1)),
        # one factor at a time, from "lexical v1"
        Variant("+stopwords", "analyzer", "bm25s' 33 English stopwords (= tantivy's english list)",
                _tantivy(TantivySetup(stopwords=en))),
        Variant("+stopwords en_plus", "analyzer", "a longer list (bm25s STOPWORDS_EN_PLUS: what, did, how, ...)",
                _tantivy(TantivySetup(stopwords=_stop("en_plus")))),
        Variant("+stopwords en_plus +repeats", "analyzer", "the longer list and query repeats",
                _tantivy(TantivySetup(stopwords=_stop("en_plus"), repeats=True))),
        Variant("no stemming", "analyzer", "drop the English stemmer", _tantivy(TantivySetup(stem=False))),
        Variant("tokens >= 2 chars", "analyzer", r"regex \w\w+ tokenizer (bm25s' token pattern)",
                _tantivy(TantivySetup(tokenizer=r"\w\w+"))),
        Variant("no citations field", "schema", "drop the citations field (beir:<collection>:<id> tokens)",
                _tantivy(TantivySetup(citations=False))),
        Variant("one field", "schema", "title + text in one field, weight 1 (no primary copy, no citations)",
                _tantivy(TantivySetup(fields="one"))),
        Variant("split fields", "schema", "the split mapping: title as primary (x3) + title+text as context (x1)",
                _tantivy(TantivySetup(fields="split"))),
        Variant("split, weights 1/1", "schema", "split mapping with primary weight 1 (= context)",
                _tantivy(TantivySetup(fields="split", weights={"primary": 1.0, "context": 1.0,
                                                                "citations": 0.5}))),
        Variant("query repeats", "query", "a query term counts per occurrence (bm25s) instead of once",
                _tantivy(TantivySetup(repeats=True))),
        Variant("max_query_terms 8", "query", "cap the distinct query terms at 8 (the shipped 1024 never binds)",
                _tantivy(TantivySetup(max_query_terms=8))),
        # k1/b: fixed in Tantivy, so measured with bm25s
        Variant("bm25s tantivy-like", "k1/b", "bm25s with the channel's tokens (1-char kept, no stopwords), "
                "distinct terms, k1 1.2 b 0.75: emulates lexical v1",
                lambda c: bm25s_run(c, 1.2, 0.75, None, TANTIVY_LIKE_TOKENS, distinct=True)),
        Variant("bm25s tantivy-like k1 .9 b .4", "k1/b", "the same with the baseline's k1 0.9, b 0.4",
                lambda c: bm25s_run(c, 0.9, 0.4, None, TANTIVY_LIKE_TOKENS, distinct=True)),
        Variant("bm25s k1 1.2 b .75", "k1/b", "the baseline with Tantivy's k1 1.2, b 0.75",
                lambda c: bm25s_run(c, 1.2, 0.75)),
        Variant("bm25s +stopwords en_plus", "k1/b", "the baseline with the longer stopword list (is the list "
                "a gain for any BM25?)", lambda c: bm25s_run(c, stopwords=list(_stop("en_plus")))),
        # combinations worth proposing
        Variant("one field +stopwords", "combined", "one field, bm25s' stopwords",
                _tantivy(TantivySetup(fields="one", stopwords=en))),
        Variant("one field +stopwords +repeats", "combined", "one field, bm25s' stopwords, query repeats",
                _tantivy(TantivySetup(fields="one", stopwords=en, repeats=True))),
        Variant("bm25s analyzer, one field, repeats", "combined", "bm25s' tokens (\\w\\w+, stopwords) in Tantivy, "
                "one field, query repeats: only k1/b and length quantization differ from bm25s",
                _tantivy(TantivySetup(fields="one", repeats=True, **BM25S_ANALYZER))),
        Variant("engine fields +stopwords +repeats", "combined", "the shipped schema and weights, bm25s' "
                "stopwords and query repeats", _tantivy(TantivySetup(stopwords=en, repeats=True))),
        Variant("engine fields +bm25s analyzer +repeats", "combined", "the shipped schema, bm25s' tokens, "
                "query repeats", _tantivy(TantivySetup(repeats=True, **BM25S_ANALYZER))),
    ]


# -- running and reporting ------------------------------------------------------------------------


def development_collections(data: Path) -> list[Path]:
    out = []
    for name in ("scifact", "cranfield", "medline"):
        if (data / name / "corpus.jsonl").exists():
            out.append(data / name)
    out += collection_folders(data / "locomo") if (data / "locomo").is_dir() else []
    return out


def study(paths: Sequence[Path], chosen: Sequence[Variant], progress: bool = True) -> dict[str, Any]:
    results: dict[str, Any] = {"collections": {}, "variants": {v.name: {"group": v.group, "what": v.what}
                                                               for v in chosen}}
    for path in paths:
        col = load_collection(path)
        name = f"locomo/{col.name}" if path.parent.name == "locomo" else col.name
        row: dict[str, Any] = {"docs": len(col.docs), "queries": len(col.queries), "scores": {}, "seconds": {}}
        for v in chosen:
            t = time.perf_counter()
            run = v.make(col)
            row["scores"][v.name] = metrics.score(run, col.qrels, METRICS)
            row["seconds"][v.name] = round(time.perf_counter() - t, 2)
            if progress:
                print(f"{name:>18} {v.name:<40} ndcg@10 {row['scores'][v.name]['ndcg@10']:.4f}", file=sys.stderr,
                      flush=True)
        # what max_query_terms would have to be to bind: the most distinct terms of any query
        analyzer = V1.analyzer()
        row["max_distinct_query_terms"] = max((len(set(analyzer.analyze(q))) for q in col.queries.values()),
                                              default=0)
        results["collections"][name] = row
    locomo = [r for n, r in results["collections"].items() if n.startswith("locomo/")]
    if locomo:
        results["locomo_mean"] = {v.name: {m: float(np.mean([r["scores"][v.name][m] for r in locomo]))
                                           for m in METRICS} for v in chosen}
    return results


# -- long queries (issue 24 section 3): the development queries made long, no judgment used -------

# A TREC-style narrative wraps the topic in instructions and restates it. "padded" does both; "boilerplate
# once" only adds the instruction words, so the topic's own terms are not repeated.
LONG_FORMS: dict[str, Callable[[str], str]] = {
    "original": lambda q: q,
    "padded": lambda q: (f"I am looking for documents that discuss the following. {q} Relevant documents must "
                         f"mention {q} Documents that only mention the topic in passing are not relevant."),
    "boilerplate once": lambda q: (f"I am looking for documents that discuss the following. {q} Documents that "
                                   "only mention the topic in passing are not relevant."),
}


def long_variants() -> list[Variant]:
    return [
        Variant("bm25s", "reference", "the baseline row: bm25s, its own tie order", baseline.run_collection),
        Variant("lexical before", "channel", "the channel before issue 24: distinct query terms, weight 1",
                _tantivy(BEFORE_QTF)),
        Variant("qtf count", "query", "a term repeated c times in the query weighs c (bm25s)",
                _tantivy(TantivySetup(stopwords=STOPWORDS, repeats=True, qtf="count"))),
        Variant("qtf 1 + ln c", "query", "a term repeated c times weighs 1 + ln c",
                _tantivy(TantivySetup(stopwords=STOPWORDS, repeats=True, qtf="log"))),
        Variant("qtf sqrt c (shipped)", "query", "a term repeated c times weighs sqrt(c): the channel now",
                _tantivy(NOW)),
        Variant("no citations field", "schema", "the shipped channel without the beir:<collection>:<id> field",
                _tantivy(TantivySetup(stopwords=STOPWORDS, citations=False))),
    ]


def long_study(paths: Sequence[Path], chosen: Sequence[Variant], progress: bool = True) -> dict[str, Any]:
    """``study`` over each collection with its queries rewritten by every LONG_FORMS form."""
    results: dict[str, Any] = {"collections": {}, "variants": {v.name: {"group": v.group, "what": v.what}
                                                               for v in chosen}}
    for path in paths:
        col = load_collection(path)
        base = f"locomo/{col.name}" if path.parent.name == "locomo" else col.name
        for form, rewrite in LONG_FORMS.items():
            long_col = Collection(col.name, col.docs, {q: rewrite(t) for q, t in col.queries.items()}, col.qrels)
            name = f"{base} ({form})"
            row: dict[str, Any] = {"docs": len(col.docs), "queries": len(col.queries), "scores": {}}
            for v in chosen:
                row["scores"][v.name] = metrics.score(v.make(long_col), col.qrels, METRICS)
                if progress:
                    print(f"{name:>32} {v.name:<24} ndcg@10 {row['scores'][v.name]['ndcg@10']:.4f}",
                          file=sys.stderr, flush=True)
            row["max_distinct_query_terms"] = max((len(set(NOW.analyzer().analyze(q)))
                                                   for q in long_col.queries.values()), default=0)
            results["collections"][name] = row
    return results


def markdown(results: Mapping[str, Any], metric: str = "ndcg@10",
             command: str = "python -m studies.lexical_study") -> str:
    names = list(results["variants"])
    cols = list(results["collections"])
    has_mean = "locomo_mean" in results
    head = [c.replace("locomo/", "") for c in cols] + (["LoCoMo mean"] if has_mean else [])
    lines = [f"# Lexical channel vs standard BM25: {metric} by variant", "",
             f"Made by `{command}` (lexical only, no embeddings). "
             "Each variant changes one factor of the shipped channel unless its group says otherwise; "
             "`bm25s` is the `baseline` row of `engram-memory eval`. **Bold**: at or above `bm25s` on that "
             "collection.", "",
             "| variant | group | " + " | ".join(head) + " |", "|---|---|" + "---:|" * len(head)]
    for v in names:
        cells = []
        for c in cols:
            x = results["collections"][c]["scores"][v][metric]
            ref = results["collections"][c]["scores"]["bm25s"][metric] if "bm25s" in names else None
            cells.append(f"**{x:.4f}**" if ref is not None and x >= ref - 5e-5 and v != "bm25s" else f"{x:.4f}")
        if has_mean:
            x = results["locomo_mean"][v][metric]
            ref = results["locomo_mean"]["bm25s"][metric] if "bm25s" in names else None
            cells.append(f"**{x:.4f}**" if ref is not None and x >= ref - 5e-5 and v != "bm25s" else f"{x:.4f}")
        lines.append(f"| {v} | {results['variants'][v]['group']} | " + " | ".join(cells) + " |")
    lines += ["", "Variants:", ""]
    lines += [f"- **{v}** ({results['variants'][v]['group']}): {results['variants'][v]['what']}" for v in names]
    lines += ["", "Most distinct analyzed terms in any query (the shipped `max_query_terms` is 1024): "
              + ", ".join(f"{c.replace('locomo/', '')} {results['collections'][c]['max_distinct_query_terms']}"
                          for c in cols) + ".", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.lexical_study", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with scifact, cranfield, medline, "
                        "locomo/ (default: ../shared/data beside the clone)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="where lexical-study.md and .json go (default: eval/)")
    parser.add_argument("--collections", default="", help="comma-separated names to keep (e.g. medline,locomo-26)")
    parser.add_argument("--variants", default="", help="comma-separated variant names to keep")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--long-queries", action="store_true", help="the long-query study instead "
                        "(issue 24): writes lexical-long-queries.md and .json")
    args = parser.parse_args(argv)
    why = baseline.unavailable()
    if why:
        parser.exit(2, f"engram-memory: error: {why}\n")
    paths = development_collections(args.data)
    if args.collections:
        keep = {n.strip() for n in args.collections.split(",") if n.strip()}
        paths = [p for p in paths if p.name in keep]
    if not paths:
        parser.exit(2, f"engram-memory: error: --data {args.data}: no development collection found\n")
    chosen = long_variants() if args.long_queries else variants()
    if args.variants:
        keep = {n.strip() for n in args.variants.split(",") if n.strip()}
        unknown = keep - {v.name for v in chosen}
        if unknown:
            parser.exit(2, f"engram-memory: error: --variants: unknown {sorted(unknown)[0]!r}\n")
        chosen = [v for v in chosen if v.name in keep or v.name == "bm25s"]
    stem = "lexical-long-queries" if args.long_queries else "lexical-study"
    results = (long_study if args.long_queries else study)(paths, chosen, progress=not args.quiet)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    command = "python -m studies.lexical_study" + (" --long-queries" if args.long_queries else "")
    (args.out / f"{stem}.md").write_text(markdown(results, command=command), encoding="utf-8")
    print(f"wrote {args.out / stem}.md and {stem}.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
