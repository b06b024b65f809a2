"""Usage mistakes on the command line: one line on stderr, exit 2, never a box or a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CLI = [str(Path(sys.executable).with_name("engram-memory"))]  # the installed console script


@pytest.mark.parametrize(
    "argv,line",
    [
        (["serve", "--bogus"], "No such option: --bogus (see: engram-memory serve --help)"),
        (["serve", "--tenant"], "Option '--tenant' requires an argument."),
        (["nope"], "No such command 'nope'. (see: engram-memory --help)"),
        (["host", "keygen"], "Missing option '--out'. (see: engram-memory host keygen --help)"),
        (["serve", "--port", "1"],
         "No such option: --port (Possible options: --store) (see: engram-memory serve --help)"),
    ],
)
def test_usage_errors_are_one_line(argv: list[str], line: str, offline_env: dict[str, str]) -> None:
    done = subprocess.run(CLI + argv, env=offline_env, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == f"engram-memory: error: {line}\n"


def test_no_arguments_shows_help_and_exits_0(offline_env: dict[str, str]) -> None:
    done = subprocess.run(CLI, env=offline_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "Usage: engram-memory" in done.stdout and "serve" in done.stdout
