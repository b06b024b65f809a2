"""The long runs, kept out of the default suite by the ``slow`` marker (pyproject addopts):

    python -m pytest -m slow -p no:cacheprovider        # all three, about 1 h 40 min on 2 cores

The state machine at 300 sequences (3 min), 100,000 fuzzed calls (22 min) and 100 crash trials
(about 75 min). Each is also one command on its own (README, Proofs). CI runs their short
versions (tests/test_state_machine.py, tests/test_hostile_input.py, tests/test_crash.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engram_memory.checks.crash import run_crash
from engram_memory.checks.fuzz import run_fuzz
from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_state_machine_at_300_sequences() -> None:
    env = {**os.environ, "ENGRAM_STATE_MACHINE_EXAMPLES": "300", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_state_machine.py::test_contract_state_machine"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=3 * 3600)
    assert done.returncode == 0, done.stdout[-4000:]


def test_fuzz_at_100k_calls(tmp_path: Path) -> None:
    summary = run_fuzz(100_000, 20261203, tmp_path)
    assert summary.calls == 100_000
    assert not summary.violations, json.dumps(summary.violations[:5], indent=1)


def test_crash_at_100_trials(tmp_path: Path) -> None:
    result = run_crash(100, seed=1, clients=4, out=tmp_path / "crash", progress=False)
    assert result["totals"]["survived"] == 100, [r.failures for r in result["results"] if r.failures][:3]
