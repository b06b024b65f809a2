"""What the learned secrets screen adds to an admission (issue 36).

    python -m studies.secret_screen_timing [--n 400]

Runs the first ``--n`` examples of every labelled corpus (checks/secrets/) through the real
admission path (an in-process engine: capture, then request_admission), timing request_admission
alone, twice over the same examples: with the rules only (``rules_only()``) and with the rules and
the learned screen. Prints p50 and p95 of each and the difference. The screen's cost depends on the
candidate's strings, not on the store's size.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from contextlib import nullcontext  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import cast  # noqa: E402

import numpy as np  # noqa: E402

from engram_memory.checks import secrets_eval  # noqa: E402
from engram_memory.models.tools import CaptureInput, RequestAdmissionInput, parse_input, to_plain  # noqa: E402
from engram_memory.store.screen.secret_model import load_model  # noqa: E402
from engram_memory.store.screen.secrets import rules_only  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400)
    args = parser.parse_args()
    examples = [e for path in sorted(secrets_eval.DATA.glob("*.jsonl"))
                for e in secrets_eval.load_corpus(path)][: args.n]
    load_model()
    with tempfile.TemporaryDirectory() as tmp:
        runner = secrets_eval.EngineRunner(Path(tmp))
        timings: dict[str, list[float]] = {"rules alone": [], "rules + classifier": []}
        try:
            for i, example in enumerate(examples):
                for mode in ("rules alone", "rules + classifier"):
                    n = 2 * i + (mode != "rules alone")
                    plain = secrets_eval.capture_arguments(example, n)
                    try:
                        cap = to_plain(runner.engine.capture(runner.ctx, cast(CaptureInput,
                                                                              parse_input("capture", plain))))
                    except Exception:  # noqa: BLE001 - refused by the schema: nothing to admit
                        continue
                    request = cast(RequestAdmissionInput, parse_input(
                        "request_admission", {"candidate_id": cap["candidate_id"],
                                              "idempotency_key": f"timing-admit-{n:08d}"}))
                    with rules_only() if mode == "rules alone" else nullcontext():
                        start = time.perf_counter()
                        runner.engine.request_admission(runner.ctx, request)
                        timings[mode].append((time.perf_counter() - start) * 1000)
        finally:
            runner.close()
    for mode, took in timings.items():
        print(f"{mode}: n={len(took)} p50 {np.percentile(took, 50):.2f} ms, p95 {np.percentile(took, 95):.2f} ms")
    added = np.percentile(timings["rules + classifier"], 50) - np.percentile(timings["rules alone"], 50)
    print(f"added by the classifier: p50 {added:.2f} ms")


if __name__ == "__main__":
    main()
