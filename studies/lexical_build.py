"""How long the lexical projection takes to build a collection: every document's language
identified (``LexicalDoc``), then one ``LexicalIndex.rebuild``, as ``rebuild-index`` does it.

    python -m studies.lexical_build ../shared/data/scifact/corpus.jsonl [--repeat 3]

Prints the best of ``--repeat`` runs of each phase (the machine is shared; the best is the least
disturbed). Run it from another checkout to compare a change with the code before it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

from engram_memory.retrieval.lexical import LexicalDoc, LexicalIndex


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.corpus.open(encoding="utf-8")]
    texts = [(r.get("title", "") + " " + r["text"]).strip() for r in rows]
    LexicalDoc("warm-up", {"primary": "Der Hund läuft über die Straße, und die Katze schläft."})  # loads the identifier
    best_docs = best_index = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        docs = [LexicalDoc(f"d{i:06d}", {"primary": text}) for i, text in enumerate(texts)]
        t1 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            index = LexicalIndex.open(Path(tmp))
            index.rebuild(docs)
            t2 = time.perf_counter()
            index.close()
        best_docs, best_index = min(best_docs, t1 - t0), min(best_index, t2 - t1)
    languages = Counter(getattr(d, "language", "en") for d in docs)
    print(f"{args.corpus}: {len(docs)} documents {dict(languages)}; documents (language id) {best_docs:.2f} s,"
          f" index {best_index:.2f} s, total {best_docs + best_index:.2f} s (best of {args.repeat})")


if __name__ == "__main__":
    main()
