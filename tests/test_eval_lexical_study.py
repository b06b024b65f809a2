"""studies/lexical_study.py: its Tantivy mirror is the shipped channel, and it writes its table.

The study's variants are only meaningful if its own Tantivy build, with the shipped settings,
ranks exactly as retrieval/lexical.py's LexicalIndex does; a changed weight must show.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from engram_memory.eval.beir import load_collection
from studies import lexical_study as ls

SAMPLE = Path(__file__).resolve().parents[1] / "eval" / "sample"


def _run(setup: ls.TantivySetup, col: ls.Collection) -> ls.Run:
    t = ls.TantivyRun(setup, col)
    return {qid: t.search(text) for qid, text in col.queries.items()}


def test_the_mirror_ranks_exactly_as_the_shipped_channel() -> None:
    col = load_collection(SAMPLE)
    shipped, described = ls.lexical_now(col)
    assert described["field_weights"] == dict(ls.NOW.weights) and described["max_query_terms"] == ls.NOW.max_query_terms
    mirror = _run(ls.NOW, col)
    assert {q: [d for d, _ in r] for q, r in mirror.items()} == {q: [d for d, _ in r] for q, r in shipped.items()}
    for q in shipped:
        assert [round(s, 3) for _, s in mirror[q]] == [round(s, 3) for _, s in shipped[q]], q
    # the comparison can fail: another primary weight changes the scores
    other = _run(ls.TantivySetup(weights={**ls.NOW.weights, "primary": 1.0}), col)
    assert any([round(s, 3) for _, s in other[q]] != [round(s, 3) for _, s in shipped[q]] for q in shipped)


def test_query_construction_factors() -> None:
    col = load_collection(SAMPLE)
    t = ls.TantivyRun(ls.TantivySetup(repeats=True), col)
    assert t.terms("backup the backup of backups")["backup"] == 3
    distinct = ls.TantivyRun(ls.V1, col)
    assert distinct.terms("backup the backup of backups") == {"backup": 1, "the": 1, "of": 1}
    capped = ls.TantivyRun(ls.TantivySetup(max_query_terms=2), col)
    assert set(capped.terms("alpha beta gamma delta")) == {"alpha", "beta"}  # the first 2 by appearance
    stop = ls.TantivyRun(ls.TantivySetup(stopwords=ls._stop("en")), col)
    assert set(stop.terms("the backup of a database")) == {"backup", "databas"}


def test_main_writes_the_table_and_the_json(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(SAMPLE, data / "medline")  # any collection under a development name
    out = tmp_path / "out"
    assert ls.main(["--data", str(data), "--out", str(out), "--variants", "lexical now,+stopwords", "--quiet"]) == 0
    results = json.loads((out / "lexical-study.json").read_text())
    assert list(results["variants"]) == ["bm25s", "lexical now", "+stopwords"]
    scores = results["collections"]["medline"]["scores"]
    assert set(scores["lexical now"]) == {"ndcg@10", "recall@10", "recall@100"}
    assert 0.8 < scores["lexical now"]["ndcg@10"] <= 1.0
    table = (out / "lexical-study.md").read_text()
    assert "| variant | group | medline |" in table and "| lexical now | reference |" in table


def test_query_term_weightings_for_long_queries() -> None:
    col = load_collection(SAMPLE)
    text = "backup the backup of backups"
    assert ls.TantivyRun(ls.TantivySetup(repeats=True, qtf="log"), col).terms(text)["backup"] == 1.0 + math.log(3)
    assert ls.TantivyRun(ls.TantivySetup(repeats=True, qtf="sqrt"), col).terms(text)["backup"] == math.sqrt(3)
    padded = ls.LONG_FORMS["padded"]("backup policy")
    assert padded.count("backup policy") == 2 and "Relevant documents" in padded
    assert ls.LONG_FORMS["boilerplate once"]("backup policy").count("backup policy") == 1


def test_main_writes_the_long_query_study(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(SAMPLE, data / "medline")
    out = tmp_path / "out"
    assert ls.main(["--data", str(data), "--out", str(out), "--long-queries", "--variants", "lexical before",
                    "--quiet"]) == 0
    results = json.loads((out / "lexical-long-queries.json").read_text())
    assert list(results["collections"]) == [f"medline ({form})" for form in ls.LONG_FORMS]
    scores = {c: r["scores"]["lexical before"]["ndcg@10"] for c, r in results["collections"].items()}
    assert scores["medline (original)"] != scores["medline (padded)"]  # the forms change the queries
    table = (out / "lexical-long-queries.md").read_text()
    assert "| variant | group | medline (original) | medline (padded) |" in table
