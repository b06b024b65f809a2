"""``engram-memory eval --dataset FOLDER``: each collection in its own scope, per-collection rows and the mean.

The end-to-end case runs the real CLI (subprocess) on two tiny collections, baseline and lexical
only (no embedding model: seconds), and checks the summary against the per-collection results.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engram_memory.eval import folder
from engram_memory.eval.beir import collection_folders

DOCS = {
    "alpha": [("a1", "Lighthouse keeper", "The keeper climbs the lighthouse stairs every night."),
              ("a2", "Harbour", "Boats rest in the harbour when storms come."),
              ("a3", "Gulls", "Gulls circle the fishing boats at dawn."),
              ("a4", "Fog", "Fog horns warn ships near the rocks.")],
    "beta": [("b1", "Bread", "Sourdough bread needs a starter and a slow rise."),
             ("b2", "Cheese", "Aged cheese is cut from large wheels."),
             ("b3", "Olives", "Olives are cured in brine for weeks."),
             ("b4", "Wine", "Red wine is kept in oak barrels.")],
}
QUERIES = {
    "alpha": {"q1": ("who climbs the lighthouse", "a1"), "q2": ("boats in a storm", "a2"),
              "q3": ("seabirds over fishing boats", "a3")},
    "beta": {"q1": ("how is sourdough bread made", "b1"), "q2": ("curing olives", "b3")},
}


def _shelf(root: Path) -> Path:
    for name, docs in DOCS.items():
        col = root / name
        (col / "qrels").mkdir(parents=True)
        (col / "corpus.jsonl").write_text("".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n"
                                                  for i, t, x in docs), encoding="utf-8")
        (col / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n"
                                                   for q, (t, _d) in QUERIES[name].items()), encoding="utf-8")
        (col / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
            f"{q}\t{d}\t1\n" for q, (_t, d) in QUERIES[name].items()), encoding="utf-8")
    (root / "notes").mkdir()  # not a collection: left out
    (root / "notes" / "readme.txt").write_text("x", encoding="utf-8")
    return root


def test_collection_folders_lists_the_collections_only(tmp_path: Path) -> None:
    shelf = _shelf(tmp_path / "shelf")
    assert [p.name for p in collection_folders(shelf)] == ["alpha", "beta"]
    assert collection_folders(shelf / "alpha") == []  # a collection is not a folder of collections
    assert collection_folders(tmp_path / "nowhere") == []


def test_mean_is_over_collections_each_counting_once() -> None:
    per = [{"lexical": {"ndcg@10": 0.2, "recall@10": 0.5}, "baseline": {"ndcg@10": 0.4, "recall@10": 0.5}},
           {"lexical": {"ndcg@10": 0.6, "recall@10": 1.0}, "baseline": {"ndcg@10": 0.4, "recall@10": 0.0}}]
    mean = folder.mean_scores(per)
    assert mean["lexical"] == pytest.approx({"ndcg@10": 0.4, "recall@10": 0.75})
    assert mean["baseline"] == pytest.approx({"ndcg@10": 0.4, "recall@10": 0.25})
    assert list(mean) == ["lexical", "baseline"]


def test_peer_runs_become_columns() -> None:
    result = {"runs": {"hybrid": {"ndcg@10": 0.5}},
              "peer": {"name": "lancedb", "runs": {"hybrid": {"ndcg@10": 0.4}, "lexical": {"ndcg@10": 0.3}}}}
    assert folder.columns(result) == {"hybrid": {"ndcg@10": 0.5}, "lancedb hybrid": {"ndcg@10": 0.4},
                                      "lancedb lexical": {"ndcg@10": 0.3}}


def test_eval_on_a_folder_of_collections(tmp_path: Path, offline_env: dict[str, str]) -> None:
    shelf = _shelf(tmp_path / "shelf")
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "engram_memory.server.cli", "eval", "--dataset", str(shelf), "--out", str(out),
            "--channels", "baseline,lexical", "--no-latency", "--no-progress"]
    done = subprocess.run(argv, env=offline_env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "a folder of 2 collections (alpha, beta)" in done.stderr
    # stdout: the table (every collection's runs and the mean), then where the report is
    table = done.stdout.splitlines()
    assert table[0].split()[0] == "run" and "ndcg@10" in table[0].split(), table
    assert [ln.split()[:2] for ln in table[1:5]] == [["alpha", "baseline"], ["alpha", "lexical"],
                                                     ["beta", "baseline"], ["beta", "lexical"]], table
    assert table[5].split()[:2] == ["mean", "baseline"] and table[6].split()[:2] == ["mean", "lexical"]
    assert table[-2:] == [f"report: {out / 'report.md'}", f"plot:   {out / 'report.png'}"]
    s = json.loads((out / "results.json").read_text())
    assert s["collections"] == ["alpha", "beta"] and s["queries"] == 5
    per = {name: json.loads((out / name / "results.json").read_text()) for name in ("alpha", "beta")}
    for name, r in per.items():
        assert r["dataset"] == name and r["model"]["model_id"] is None  # lexical only: no model loaded
        assert s["per_collection"][name]["runs"] == r["runs"]
        assert (out / name / "runs" / f"{name}.baseline.trec").exists()
    # each collection in its own scope: its own store, and no hit from the other collection
    assert per["alpha"]["store"]["dir"] != per["beta"]["store"]["dir"]
    for name in ("alpha", "beta"):
        hits = {line.split()[2] for line in (out / name / "runs" / f"{name}.lexical.trec").read_text().splitlines()}
        assert hits and all(h.startswith(name[0]) for h in hits), hits
    for run in ("baseline", "lexical"):
        for m in ("ndcg@10", "recall@10", "recall@100"):
            want = (per["alpha"]["runs"][run][m] + per["beta"]["runs"][run][m]) / 2
            assert s["mean"][run][m] == pytest.approx(want), (run, m)
    report = (out / "report.md").read_text()
    for fragment in ("## ndcg@10", "## recall@10", "## recall@100", "| alpha |", "| beta |", "| **mean** |",
                     "| collection | baseline | lexical |"):
        assert fragment in report, fragment
    assert (out / "report.png").stat().st_size > 0
    assert any(ln.split()[:2] == ["mean", "lexical"] for ln in done.stdout.splitlines())
