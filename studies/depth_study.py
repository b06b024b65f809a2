"""Study: how many hits each channel hands to fusion (``CHANNEL_DEPTH``), as a relevance decision.

``python -m studies.depth_study --depths 1000,200,100 --out out/depth`` runs the real eval path (hybrid,
the engine's fusion and rerank) on every development collection and LoCoMo conversation, once per
depth, over one cached store per collection, and writes ``studies/depth-study.json`` and
``studies/depth-study.md``: nDCG@10 and recall@100 per collection and depth, and each depth's
difference from the first. Issue 39's rule for changing the depth: nDCG@10 within 0.005 of today on
every collection and conversation, recall@100 not lower.

Each (collection, depth) runs in its own process, since a process's engine keeps one depth.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

COLLECTIONS = ("cranfield", "medline", "scifact", *(f"locomo/locomo-{n}" for n in (26, 30, 41, 42, 43)))
STUDY = Path(__file__).resolve().parent

# Run in a child process: the eval command with every ReadPath at the given depth.
_ONE = """
import sys
depth = int(sys.argv[1])
import engram_memory.store.core.reads as reads
search = reads.ReadPath.search
def at_depth(self, *args, **kwargs):
    self.channel_depth = depth
    return search(self, *args, **kwargs)
reads.ReadPath.search = at_depth
from engram_memory.eval.__main__ import app
sys.argv = ["eval", "eval", "--dataset", sys.argv[2], "--out", sys.argv[3], "--channels", "hybrid",
            "--cache-dir", sys.argv[4], "--no-progress", "--no-latency"]
app()
"""


def hybrid_scores(results: Path) -> dict[str, float]:
    """nDCG@10 and recall@100 of the hybrid run in an eval's results.json."""
    scores = json.loads(results.read_text(encoding="utf-8"))["runs"]["hybrid"]
    return {"ndcg@10": float(scores["ndcg@10"]), "recall@100": float(scores["recall@100"])}


def main(
    data: Annotated[Path, typer.Option(help="The development collections.")] = Path("../shared/data"),
    out: Annotated[Path, typer.Option(help="Eval outputs and the stores' cache.")] = Path("out/depth"),
    depths: Annotated[str, typer.Option(help="Comma-separated; the first is the reference.")] = "1000,200,100",
    only: Annotated[str, typer.Option(help="Comma-separated collections (default: all).")] = "",
) -> None:
    wanted = [d for d in (only.split(",") if only else COLLECTIONS) if d]
    levels = [int(d) for d in depths.split(",")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    table: dict[str, dict[str, dict[str, float]]] = {}
    for name in wanted:
        key = name.replace("/", "_")
        for depth in levels:
            run = out / f"{key}-{depth}"
            if not (run / "results.json").is_file():
                sys.stderr.write(f"depth study: {name} at depth {depth}\n")
                subprocess.run([sys.executable, "-c", _ONE, str(depth), str(data / name), str(run),
                                str(out / f"cache-{key}")], env=env, check=True)
            table.setdefault(name, {})[str(depth)] = hybrid_scores(run / "results.json")
    (STUDY / "depth-study.json").write_text(json.dumps({"depths": levels, "collections": table}, indent=1) + "\n",
                                            encoding="utf-8")
    ref = str(levels[0])
    lines = ["# Channel depth: nDCG@10 and recall@100 of hybrid search per depth", "",
             f"`python -m studies.depth_study --depths {depths}` (development collections; Δ against depth {ref}).",
             "", "| collection | " + " | ".join(f"depth {d}: nDCG@10 / R@100" for d in levels) + " |",
             "|---|" + "---|" * len(levels)]
    for name, by_depth in table.items():
        cells = []
        for d in levels:
            s, r = by_depth[str(d)], by_depth[ref]
            dn, dr = s["ndcg@10"] - r["ndcg@10"], s["recall@100"] - r["recall@100"]
            delta = "" if str(d) == ref else f" (Δ {dn:+.4f} / {dr:+.4f})"
            cells.append(f"{s['ndcg@10']:.4f} / {s['recall@100']:.4f}{delta}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    (STUDY / "depth-study.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    typer.run(main)
