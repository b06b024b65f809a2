"""``engram-memory eval|bench`` refuse a bad value before any work, and the shipped sample runs.

Each refusal runs the real CLI as a subprocess (``python -m engram_memory.server.cli``, with the
``offline_env`` environment). It must exit 2 and print nothing on stdout. It must print exactly one
stderr line, starting ``engram-memory: error: `` (so no traceback). It must return quickly and
create nothing: no ``--out`` folder and no store. A refusal costs about a second of imports, so
the cases run concurrently, once per module.

A positive run scores ``eval/sample`` (lexical, semantic, hybrid) with the README's command and
checks the files it writes. ``bench`` must say what it does from its first second.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from engram_memory.eval import options
from engram_memory.eval.beir import CollectionError, load_collection

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "eval" / "sample"
PREFIX = "engram-memory: error: "
# A refusal takes about a second; loading the embedding model alone takes longer, an ingest minutes.
REFUSAL_S = 30.0
HEAVY = ("torch", "sentence_transformers", "ranx", "tantivy", "duckdb", "engram_memory.store.core.engine")

CORPUS = "".join(json.dumps({"_id": f"d{i}", "title": f"Title {i}", "text": f"text about topic {i}"}) + "\n"
                 for i in range(1, 6))
QUERIES = "".join(json.dumps({"_id": f"q{i}", "text": f"topic {i}"}) + "\n" for i in range(1, 4))
QRELS = "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(1, 4))


def _collection(root: Path, corpus: str | None = CORPUS, queries: str | None = QUERIES,
                qrels: str | None = QRELS) -> Path:
    root.mkdir(parents=True)
    if corpus is not None:
        (root / "corpus.jsonl").write_text(corpus, encoding="utf-8")
    if queries is not None:
        (root / "queries.jsonl").write_text(queries, encoding="utf-8")
    if qrels is not None:
        (root / "qrels").mkdir()
        (root / "qrels" / "test.tsv").write_text(qrels, encoding="utf-8")
    return root


def _broken_collections(data: Path) -> None:
    """Next to eval/sample (the good one): every way a collection folder can be wrong."""
    _collection(data / "empty", None, None, None)
    _collection(data / "no-corpus", corpus=None)
    _collection(data / "no-queries", queries=None)
    _collection(data / "no-qrels", qrels=None)
    lines = CORPUS.splitlines(keepends=True)
    _collection(data / "bad-corpus", corpus="".join(lines[:2]) + '{"_id": "d3", "text": }\n' + "".join(lines[3:]))
    _collection(data / "bad-queries", queries=QUERIES.splitlines(keepends=True)[0] + "not json at all\n")
    _collection(data / "no-id", corpus=CORPUS + '{"title": "no id here", "text": "x"}\n')
    _collection(data / "dup-id", corpus=CORPUS + json.dumps({"_id": "d2", "text": "again"}) + "\n")
    _collection(data / "qrels-nothing", qrels="query-id\tcorpus-id\tscore\nq1\tx1\t1\nq2\tx2\t1\n")
    _collection(data / "qrels-unknown-query", qrels=QRELS + "q9\td1\t1\n")
    _collection(data / "qrels-bad-score", qrels=QRELS + "q1\td4\thigh\n")
    _collection(data / "qrels-bad-header", qrels="qid\tdid\trel\nq1\td1\t1\n")
    _collection(data / "qrels-empty", qrels="")
    _collection(data / "shelf" / "one")
    _collection(data / "shelf" / "two")
    _collection(data / "deep" / "shelf" / "one")  # collections only two levels down
    _collection(data / "mixed" / "good")  # a folder of collections with a broken one
    _collection(data / "mixed" / "bad", qrels=None)
    (data / "a-file.txt").write_text("not a folder\n", encoding="utf-8")


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]  # {sample} {data} {out} {cache} are filled in per case
    says: str  # a fragment the one error line must contain


def case(id: str, args: str, says: str) -> Case:
    return Case(id, tuple(args.split()), says)


GOOD = "eval --dataset {sample} --out {out}"
CASES = [
    # -- option values: refused before the corpus is even read -------------------------------
    case("fusion-unknown", GOOD + " --fusion median", "--fusion: unknown method 'median'; choose from rrf"),
    case("channels-unknown", GOOD + " --channels lexical,dense", "--channels: unknown channel 'dense'"),
    case("rrf-k-zero", GOOD + " --fusion rrf --rrf-k 0", "--rrf-k takes a whole number >= 1, got 0"),
    case("rrf-k-text", GOOD + " --fusion rrf --rrf-k abc", "--rrf-k takes a whole number >= 1, got 'abc'"),
    case("rrf-k-without-rrf", GOOD + " --rrf-k 10", "--rrf-k is the RRF constant; the fusion is dbsf"),
    case("weights-one-number", GOOD + " --weights 0.5", "--weights takes two numbers lexical,semantic"),
    case("weights-with-rrf", GOOD + " --fusion rrf --weights 0.4,0.6", "RRF takes no weights"),
    case("fusion-without-hybrid", GOOD + " --channels lexical --fusion dbsf", "only changes the hybrid run"),
    case("limit-docs-zero", GOOD + " --limit-docs 0", "--limit-docs takes a whole number >= 1, got 0"),
    case("limit-docs-keeps-nothing", GOOD + " --limit-docs 1", "--limit-docs 1 keeps no fully judged query"),
    case("max-queries-text", GOOD + " --max-queries many", "--max-queries takes a whole number >= 1"),
    case("threads-zero", GOOD + " --threads 0", "--threads takes a whole number >= 1, got 0"),
    case("mapping-unknown", GOOD + " --mapping both", "--mapping: unknown value 'both'; choose from single or split"),
    case("peer-unknown", GOOD + " --peer chroma", "--peer: unknown value 'chroma'; choose from lancedb"),
    # -- paths ----------------------------------------------------------------------------------
    case("out-missing", "eval --dataset {sample}", "--out DIR is required"),
    case("dataset-missing", "eval --out {out}", "--dataset DIR is required"),
    case("out-is-a-file", "eval --dataset {sample} --out {data}/a-file.txt", "a-file.txt: is a file, not a folder"),
    case("cache-dir-is-a-file", GOOD + " --cache-dir {data}/a-file.txt", "error: --cache-dir "),
    case("dataset-does-not-exist", "eval --dataset {data}/nowhere --out {out}", "nowhere: does not exist"),
    # -- collection layout and content --------------------------------------------------------
    case("no-beir-files", "eval --dataset {data}/empty --out {out}",
         "not a BEIR collection: no corpus.jsonl, queries.jsonl or qrels/test.tsv"),
    case("no-corpus", "eval --dataset {data}/no-corpus --out {out}", "not a BEIR collection: no corpus.jsonl ("),
    case("no-queries", "eval --dataset {data}/no-queries --out {out}", "not a BEIR collection: no queries.jsonl ("),
    case("no-qrels", "eval --dataset {data}/no-qrels --out {out}", "not a BEIR collection: no qrels/test.tsv ("),
    case("folder-of-folders", "eval --dataset {data}/deep --out {out}",
         "deep: holds collections only in sub-sub-folders (shelf/one): pass one of them, or a folder whose "
         "sub-folders are collections, e.g. --dataset"),
    case("folder-with-a-broken-collection", "eval --dataset {data}/mixed --out {out}",
         "mixed/bad: not a BEIR collection: no qrels/test.tsv"),
    case("corpus-not-json", "eval --dataset {data}/bad-corpus --out {out}", "corpus.jsonl line 3: not valid JSON"),
    case("queries-not-json", "eval --dataset {data}/bad-queries --out {out}", "queries.jsonl line 2: not valid JSON"),
    case("qrels-reference-nothing", "eval --dataset {data}/qrels-nothing --out {out}",
         "qrels/test.tsv references nothing in corpus.jsonl"),
    case("qrels-unknown-query", "eval --dataset {data}/qrels-unknown-query --out {out}",
         "judges 1 query that queries.jsonl does not have (e.g. query-id 'q9' on line 5)"),
    # -- bench ----------------------------------------------------------------------------------
    case("bench-out-missing", "bench --sizes 100", "--out DIR is required"),
    case("bench-sizes-zero", "bench --out {out} --sizes 0", "--sizes takes positive store sizes, got 0"),
    case("bench-sizes-text", "bench --out {out} --sizes 1000,10k", "--sizes takes whole numbers, e.g. 1000,10000; "
         "got '10k'"),
    case("bench-queries-zero", "bench --out {out} --queries 0", "--queries takes a whole number >= 1, got 0"),
    case("bench-profile-negative", "bench --out {out} --profile -1", "--profile takes a whole number >= 0, got -1"),
    case("bench-peer-unknown", "bench --out {out} --peer chroma", "--peer: unknown value 'chroma'"),
    case("bench-resume-nothing", "bench --out {out} --resume", "--resume: no store to resume"),
    case("bench-dataset-does-not-exist", "bench --out {out} --dataset {data}/nowhere", "nowhere: does not exist"),
    case("bench-dataset-not-json", "bench --out {out} --dataset {data}/bad-corpus", "corpus.jsonl line 3"),
    case("bench-folder-of-collections", "bench --out {out} --dataset {data}/shelf",
         "is a folder of 2 collections (one, two), not a collection: pass one of them"),
]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "engram_memory.server.cli", *args]


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    out: Path
    cache: Path


@pytest.fixture(scope="module")
def refusals(tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str]) -> dict[str, Ran]:
    """Every case, run concurrently once: ``case id -> what the CLI did``."""
    root = tmp_path_factory.mktemp("eval-cli-errors")
    data = root / "data"
    _broken_collections(data)

    def run(c: Case) -> Ran:
        out, cache = root / "runs" / c.id / "out", root / "runs" / c.id / "cache"
        fill = {"sample": str(SAMPLE), "data": str(data), "out": str(out), "cache": str(cache)}
        argv = cli(*(a.format(**fill) for a in c.args))
        t = time.perf_counter()
        done = subprocess.run(argv, env=offline_env, cwd=root, capture_output=True, text=True, timeout=120)
        return Ran(done.returncode, done.stdout, done.stderr, time.perf_counter() - t, out, cache)

    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 2)) as pool:
        return dict(zip([c.id for c in CASES], pool.map(run, CASES), strict=True))


def test_case_ids_are_unique() -> None:
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_refused_before_any_work(c: Case, refusals: dict[str, Ran]) -> None:
    ran = refusals[c.id]
    assert "Traceback" not in ran.stderr, ran.stderr
    lines = ran.stderr.splitlines()
    assert len(lines) == 1, ran.stderr
    assert lines[0].startswith(PREFIX), lines[0]
    assert c.says in lines[0], lines[0]
    assert ran.returncode == 2, (ran.returncode, ran.stderr)
    assert ran.stdout == ""
    assert ran.seconds < REFUSAL_S, ran.seconds
    assert not ran.out.exists(), f"{ran.out} was created"
    assert not ran.cache.exists(), f"{ran.cache} was created"


@pytest.mark.parametrize("args", [
    ["eval", "--dataset", str(SAMPLE), "--out", "{out}", "--fusion", "median"],
    ["eval", "--dataset", "{bad}", "--out", "{out}"],
    ["bench", "--out", "{out}", "--sizes", "0"],
], ids=["bad-option", "bad-collection", "bench-bad-option"])
def test_a_refusal_loads_nothing_heavy(args: list[str], tmp_path: Path, offline_env: dict[str, str]) -> None:
    """The refusal comes before torch, the model, ranx or the engine are even imported."""
    bad = _collection(tmp_path / "bad", corpus='{"_id": "d1", "text": "ok"}\n{broken\n')
    out, modules = tmp_path / "out", tmp_path / "modules.txt"
    probe = ("import atexit, runpy, sys\n"
             f"atexit.register(lambda: open({str(modules)!r}, 'w').write('\\n'.join(sorted(sys.modules))))\n"
             f"sys.argv = ['engram-memory'] + {[a.format(out=out, bad=bad) for a in args]!r}\n"
             "runpy.run_module('engram_memory.server.cli', run_name='__main__', alter_sys=True)\n")
    done = subprocess.run([sys.executable, "-c", probe], env=offline_env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith(PREFIX), done.stderr
    loaded = set(modules.read_text().splitlines())
    assert not {m for m in loaded if m.split(".")[0] in HEAVY or m in HEAVY}, sorted(loaded & set(HEAVY))
    assert not out.exists()


# -- the loader, in process (fast): the finer ways a collection can be wrong -------------------

LOADER_CASES = [
    ("no-id", 'corpus.jsonl line 6: no "_id"'),
    ("dup-id", "corpus.jsonl line 6: duplicate _id 'd2' (first on line 2)"),
    ("qrels-bad-score", "qrels/test.tsv line 5: score 'high' is not an integer"),
    ("qrels-bad-header", "qrels/test.tsv line 1: header 'qid\\tdid\\trel'; expected query-id<TAB>corpus-id<TAB>score"),
    ("qrels-empty", "qrels/test.tsv is empty (needs the header query-id<TAB>corpus-id<TAB>score)"),
    ("a-file.txt", "is a file, not a folder ("),
]


@pytest.mark.parametrize(("name", "says"), LOADER_CASES, ids=[n for n, _ in LOADER_CASES])
def test_loader_refuses_in_one_line(name: str, says: str, tmp_path: Path) -> None:
    _broken_collections(tmp_path)
    with pytest.raises(CollectionError) as info:
        load_collection(tmp_path / name)
    assert says in info.value.detail and "\n" not in str(info.value), info.value.detail



def test_loader_errors_name_the_folder_the_file_and_the_line(tmp_path: Path) -> None:
    bad = _collection(tmp_path / "c", corpus=CORPUS + "\n" + '["a list"]\n')
    with pytest.raises(CollectionError) as info:
        load_collection(bad)
    assert info.value.path == bad
    assert info.value.detail == "corpus.jsonl line 7: expected a JSON object, got list"
    assert str(info.value) == f"{bad}: {info.value.detail}" and "\n" not in str(info.value)


def test_judgments_on_some_missing_documents_are_a_warning(tmp_path: Path) -> None:
    """Some relevant documents absent from the corpus: scored as never retrieved, and said."""
    col = load_collection(_collection(tmp_path / "c", qrels=QRELS + "q1\tgone\t1\n"))
    assert col.qrels["q1"] == {"d1": 1, "gone": 1}
    assert len(col.warnings) == 1 and "1 of 4 relevant judgments" in col.warnings[0]
    assert "'gone' on line 5" in col.warnings[0]


def test_the_sample_is_a_clean_beir_collection() -> None:
    col = load_collection(SAMPLE)
    assert (len(col.docs), len(col.queries), col.warnings) == (120, 70, [])
    assert all(max(judged.values()) == 2 for judged in col.qrels.values())
    assert {d.doc_id.split("-")[0] for d in col.docs} == {"db", "k8s", "sec", "git", "py", "net"}


def test_option_names_match_the_harness() -> None:
    """eval/options.py keeps its own copies (it must not import the engine side): they agree."""
    from engram_memory.eval.ingest import CHANNEL_SETS, MAPPINGS

    assert options.ENGINE_CHANNELS == tuple(CHANNEL_SETS)
    assert options.CHANNEL_NAMES == ("baseline", *CHANNEL_SETS)
    assert options.MAPPINGS == MAPPINGS
    from engram_memory.models.settings import EMBEDDING_MODELS

    assert options.MODELS == EMBEDDING_MODELS


# -- bench says what it does from the start ---------------------------------------------------


def test_bench_reports_progress_from_the_start(tmp_path: Path, offline_env: dict[str, str]) -> None:
    """Without --dataset the bench first generates its synthetic text: said at once, done in seconds.

    (It used to take over a minute with no output.) The bench is stopped once the text is ready.
    """
    out = tmp_path / "bench"
    argv = cli("bench", "--out", str(out), "--sizes", "100", "--queries", "5", "--ops-sample", "1", "--no-mcp",
               "--threads", "1", "--no-progress")
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=offline_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    seen: list[tuple[float, str]] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append((time.perf_counter() - t0, line.rstrip("\n")))
            if line.startswith("bench: opening the store") or time.perf_counter() - t0 > 120:
                break
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    text = [line for _, line in seen]
    assert text and text[0].startswith("bench: sizes 100;"), text
    assert seen[0][0] < REFUSAL_S, seen
    assert any(line.startswith("bench: generating synthetic record text") for line in text), text
    ready = [s for s, line in seen if line.startswith("bench: 20,000 distinct record texts")]
    assert ready and ready[0] < 45.0, seen  # torch import + ~1 s of text, not a silent minute
    assert text[-1].startswith("bench: opening the store"), text


# -- the shipped sample, end to end ------------------------------------------------------------


def test_eval_on_the_shipped_sample(tmp_path: Path, offline_env: dict[str, str]) -> None:
    """The README's first command, from the clone: the baseline, lexical, semantic and hybrid on eval/sample."""
    out = tmp_path / "out"
    argv = cli("eval", "--dataset", "eval/sample", "--out", str(out), "--threads", "1", "--no-latency",
               "--no-progress")
    done = subprocess.run(argv, env=offline_env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert f"wrote {out / 'results.json'}" in done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[0] == "run" and lines[-1] == f"plot:   {out / 'report.png'}", done.stdout
    runs = {ln.split()[1]: float(ln.split()[2]) for ln in lines[1:5]}
    results = json.loads((out / "results.json").read_text())
    assert runs == {name: round(scores[next(iter(scores))], 4) for name, scores in results["runs"].items()}
    for name in ("results.json", "report.md", "report.png"):
        assert (out / name).stat().st_size > 0, name
    for ch in ("baseline", "lexical", "semantic", "hybrid"):
        trec = (out / "runs" / f"sample.{ch}.trec").read_text().splitlines()
        assert trec and len(trec[0].split()) == 6
    r = json.loads((out / "results.json").read_text())
    assert list(r["runs"]) == ["baseline", "lexical", "semantic", "hybrid"]
    assert (r["baseline"]["engine"], r["baseline"]["k1"], r["baseline"]["b"]) == ("bm25s", 0.9, 0.4)
    assert set(r["runs"]["baseline"]) == {"ndcg@10", "recall@10", "recall@100", "mrr@10", "map@100"}
    assert (r["dataset"], r["docs"], r["queries"], r["admitted"], r["rejected"]) == ("sample", 120, 70, 120, [])
    contributed = {ch: [c["channel"] for c in rec["channels"] if c["contributed"]]
                   for ch, rec in r["receipts"].items()}
    assert contributed == {"lexical": ["lexical"], "semantic": ["semantic"], "hybrid": ["lexical", "semantic"]}
    ndcg = {ch: scores["ndcg@10"] for ch, scores in r["runs"].items()}
    assert min(ndcg.values()) > 0.7, ndcg  # every channel finds most answers
    assert ndcg["hybrid"] > max(ndcg["lexical"], ndcg["semantic"]), ndcg  # and the hybrid gains on both
    report = (out / "report.md").read_text()
    assert "| hybrid |" in report and "| baseline |" in report and "lexical vs baseline: p = " in report
    # Hard enough to tell channels apart: the hybrid beats the lexical channel significantly.
    p = float(report.split("hybrid vs lexical: p = ")[1].split()[0])
    assert p < 0.05, report
