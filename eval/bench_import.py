"""``python -m engram_memory.eval bench-import``: the time, CPU and peak memory of an ``admin import``
of N generated knowledge-graph observations into a new DuckDB store (issue 40 §3's figure).

The file is what the MCP memory server's ``memory.jsonl`` holds: one entity per line, PER_ENTITY
observations each ("Entity 17 (note): Observation 17-3 about ledger 173 ..."), every one a distinct
item. The import runs as the operator runs it, ``engram-memory admin import --scope acme/bench
--from FILE --data-dir DIR --json``, in a child process: wall time around it, CPU time and peak RSS
from the kernel's accounting of that child (getrusage). The JSON written to ``--out`` holds the
figures, the counts the import reported and the exact command.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

PER_ENTITY = 10  # observations per generated entity
SCOPE = "acme/bench"


def graph_lines(items: int, per_entity: int = PER_ENTITY) -> list[dict[str, Any]]:
    """Entity lines carrying ``items`` observations in all (the last entity may hold fewer)."""
    lines = []
    for e in range((items + per_entity - 1) // per_entity):
        count = min(per_entity, items - e * per_entity)
        lines.append({"type": "entity", "name": f"Entity {e}", "entityType": "note",
                      "observations": [f"Observation {e}-{k} about ledger {e * per_entity + k} and invoice"
                                       f" {(e * 7 + k) % 1000}" for k in range(count)]})
    return lines


def write_graph(path: Path, items: int) -> None:
    with open(path, "w", encoding="utf-8") as out:
        for line in graph_lines(items):
            out.write(json.dumps(line) + "\n")


def run(items: int, work: Path) -> dict[str, Any]:
    """Generate the file in ``work``, import it into a new store there, and measure the import."""
    work.mkdir(parents=True, exist_ok=True)
    graph, store = work / f"graph-{items}.jsonl", work / f"store-{items}"
    write_graph(graph, items)
    shutil.rmtree(store, ignore_errors=True)
    command = ["engram-memory", "admin", "import", "--scope", SCOPE, "--from", str(graph), "--data-dir", str(store),
               "--json"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "engram_memory.server.cli", *command[1:]], env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"the import exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    counts = json.loads(proc.stdout)["counts"]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "items": items,
        "counts": counts,
        "wall_s": round(wall, 2),
        "items_per_s": round(items / wall, 1),
        "cpu_user_s": round(after.ru_utime - before.ru_utime, 2),
        "cpu_system_s": round(after.ru_stime - before.ru_stime, 2),
        "items_per_cpu_s": round(items / cpu, 1) if cpu else None,
        "peak_rss_mib": round(after.ru_maxrss / 1024, 1),  # Linux: KiB, the largest child so far
        "cpus": os.cpu_count(),
        "command": " ".join(command),
    }


def bench_import_cmd(
    items: Annotated[int, typer.Option("--items", min=1, help="Observations to generate and import.")] = 50_000,
    out: Annotated[Path, typer.Option("--out", help="The JSON file to write the figures to.")] = Path(
        "bench-import.json"),
    work_dir: Annotated[Path | None, typer.Option("--work-dir", help="Where the file and the store go (default:"
                                                  " beside --out, bench-import-work/; kept).")] = None,
) -> None:
    """Time an `admin import` of N generated knowledge-graph observations into a new DuckDB store:
    wall time, items/s, CPU time and peak RSS of the import process, as JSON."""
    work = work_dir or out.absolute().parent / "bench-import-work"
    sys.stderr.write(f"bench-import: importing {items} generated observation(s) in {work}\n")
    try:
        result = run(items, work)
    except (RuntimeError, OSError) as exc:
        sys.stderr.write(f"engram-memory: error: {exc}\n")
        raise typer.Exit(1) from None
    out.write_text(json.dumps(result, indent=2) + "\n")
    sys.stderr.write(f"bench-import: {items} item(s) in {result['wall_s']} s ({result['items_per_s']} items/s),"
                     f" {result['cpu_user_s'] + result['cpu_system_s']:.1f} s CPU, peak RSS"
                     f" {result['peak_rss_mib']} MiB -> {out}\n")
