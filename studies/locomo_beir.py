"""LoCoMo's conversations (``locomo10.json``, snap-research/locomo) as BEIR collections.

    python -m studies.locomo_beir --source locomo10.json --out out/locomo-unseen [--skip 26,30,41,42,43]

Writes one folder per conversation, ``OUT/locomo-N`` (N from the sample id ``conv-N``), in the
layout of ``../shared/data/locomo`` (its README): a document per dialogue turn (``_id`` = the
turn's dia_id, ``title`` = "session K, <session date>", ``text`` = "speaker: words" plus
" [shares a photo: <caption>]" when the turn shares one), queries = the questions of categories
1-4 (the adversarial category 5 is dropped; ``metadata`` holds the category and the answer),
numbered ``q0, q1, ...`` over those questions and kept when their evidence names at least one turn
of the conversation; qrels = those evidence turns (score 1).

``--skip`` leaves out the conversations the defaults were chosen on (the five in
``../shared/data/locomo``), so what is written is held-out data for ``engram-memory eval``.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

CATEGORIES = (1, 2, 3, 4)
DEVELOPMENT = "26,30,41,42,43"  # ../shared/data/locomo
_DIA = re.compile(r"D\d+:\d+")
_SESSION = re.compile(r"session_(\d+)$")


def turns(conversation: dict[str, Any]) -> list[dict[str, str]]:
    """The conversation's turns as BEIR documents, in session order."""
    sessions = sorted((int(m.group(1)), key) for key in conversation if (m := _SESSION.match(key)))
    docs = []
    for number, key in sessions:
        title = f"session {number}, {conversation[f'{key}_date_time']}"
        for turn in conversation[key]:
            text = f"{turn['speaker']}: {turn['text']}"
            if turn.get("blip_caption"):
                text += f" [shares a photo: {turn['blip_caption']}]"
            docs.append({"_id": turn["dia_id"], "title": title, "text": text})
    return docs


def collection(sample: dict[str, Any]) -> tuple[list[dict[str, str]], list[dict[str, Any]], list[tuple[str, str]]]:
    """(corpus, queries, qrels) of one LoCoMo sample."""
    corpus = turns(sample["conversation"])
    known = {doc["_id"] for doc in corpus}
    queries: list[dict[str, Any]] = []
    qrels: list[tuple[str, str]] = []
    asked = [qa for qa in sample["qa"] if qa.get("category") in CATEGORIES]
    for number, qa in enumerate(asked):  # q<number> over categories 1-4, kept or not (as on disk)
        # evidence is a list of dia_ids, sometimes several in one string ("D8:6; D9:17")
        evidence = list(dict.fromkeys(d for item in qa.get("evidence", []) for d in _DIA.findall(str(item))))
        evidence = [d for d in evidence if d in known]
        if not evidence:
            continue
        qid = f"q{number}"
        queries.append({"_id": qid, "text": qa["question"],
                        "metadata": {"category": qa["category"], "answer": str(qa.get("answer", ""))}})
        qrels.extend((qid, d) for d in evidence)
    return corpus, queries, qrels


def write(out: Path, corpus: list[dict[str, str]], queries: list[dict[str, Any]], qrels: list[tuple[str, str]]) -> None:
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    (out / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (out / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    judged = "".join(f"{q}\t{d}\t1\n" for q, d in qrels)
    (out / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + judged)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, required=True, help="locomo10.json")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--skip", default=DEVELOPMENT, help="conversation numbers to leave out (comma-separated)")
    args = parser.parse_args(argv)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    for sample in json.loads(args.source.read_text(encoding="utf-8")):
        number = str(sample["sample_id"]).rsplit("-", 1)[-1]
        if number in skip:
            continue
        corpus, queries, qrels = collection(sample)
        write(args.out / f"locomo-{number}", corpus, queries, qrels)
        print(f"locomo-{number}: {len(corpus)} docs, {len(queries)} queries, {len(qrels)} qrels")


if __name__ == "__main__":
    main()
