"""studies/locomo_beir.py writes LoCoMo conversations in the layout of ../shared/data/locomo.

locomo10.json is not on disk, so each development conversation is turned back into its LoCoMo
sample (sessions of {speaker, dia_id, text, blip_caption}, qa with category and evidence, plus an
adversarial question and evidence outside the conversation, which must be dropped) and converted
again: the three files must come back byte for byte.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from studies import locomo_beir

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo"
_TITLE = re.compile(r"session (\d+), (.*)$")
_PHOTO = " [shares a photo: "


def as_sample(folder: Path) -> dict[str, Any]:
    conversation: dict[str, Any] = {}
    for line in (folder / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
        doc = json.loads(line)
        m = _TITLE.match(doc["title"])
        assert m, doc["title"]
        speaker, words = doc["text"].split(": ", 1)
        turn = {"speaker": speaker, "dia_id": doc["_id"], "text": words}
        if _PHOTO in words:
            turn["text"], caption = words.split(_PHOTO, 1)
            turn["blip_caption"] = caption.removesuffix("]")
        conversation[f"session_{m.group(1)}_date_time"] = m.group(2)
        conversation.setdefault(f"session_{m.group(1)}", []).append(turn)
    evidence: dict[str, list[str]] = {}
    for line in (folder / "qrels" / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        qid, doc_id, _ = line.split("\t")
        evidence.setdefault(qid, []).append(doc_id)
    queries = [json.loads(line) for line in (folder / "queries.jsonl").read_text(encoding="utf-8").splitlines()]
    by_number = {int(q["_id"][1:]): q for q in queries}
    qa: list[dict[str, Any]] = [
        {"question": "Adversarial?", "adversarial_answer": "-", "category": 5, "evidence": ["D1:1"]}]
    for number in range(max(by_number) + 1):
        q = by_number.get(number)
        if q is None:  # a question of categories 1-4 whose evidence is not in the conversation
            qa.append({"question": "Unjudged?", "answer": "-", "category": 1, "evidence": ["D99:1"]})
        else:
            qa.append({"question": q["text"], "answer": q["metadata"]["answer"], "category": q["metadata"]["category"],
                       "evidence": evidence[q["_id"]]})
    return {"sample_id": f"conv-{folder.name.rsplit('-', 1)[-1]}", "conversation": conversation, "qa": qa}


@pytest.mark.skipif(not DATA.is_dir(), reason="needs ../shared/data/locomo")
def test_a_conversation_converts_to_the_files_on_disk(tmp_path: Path) -> None:
    folders = sorted(DATA.iterdir())
    assert [f.name for f in folders] == [f"locomo-{n}" for n in locomo_beir.DEVELOPMENT.split(",")]
    source = tmp_path / "locomo10.json"
    source.write_text(json.dumps([as_sample(f) for f in folders]))
    locomo_beir.main(["--source", str(source), "--out", str(tmp_path / "out"), "--skip", "30"])
    assert not (tmp_path / "out" / "locomo-30").exists()
    for folder in folders:
        if folder.name == "locomo-30":
            continue
        for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"):
            assert (tmp_path / "out" / folder.name / name).read_bytes() == (folder / name).read_bytes(), (folder, name)
