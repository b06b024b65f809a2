"""examples/host.py runs, as a user would run it, against a real HTTP server and keys from keygen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.http_fixtures import HostKit, http_server

EXAMPLE = REPO / "examples" / "host.py"
STEPS = ("[1] list tools: engram_memory_search, engram_memory_get, engram_memory_capture, "
         "engram_memory_request_admission, engram_memory_withdraw, engram_memory_forget",
         "[2] capture: committed_pending candidate ", "[3] request_admission: accepted record mem_",
         "[4] search: ", "[5] get: mem_", "[6] capture + withdraw: candidate ",
         "[7] forget: mem_", "[8] get after forget: NOT_FOUND", "lifecycle complete")


def run_example(url: str, keys: Path, kid: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(EXAMPLE), "--url", url, "--host-keys-dir", str(keys), "--kid", kid],
                          env=env, cwd=str(keys), capture_output=True, text=True, timeout=120)


def test_example_host_walks_the_lifecycle(tmp_path: Path, offline_env: dict[str, str]) -> None:
    kit = HostKit(tmp_path / "keys")
    kit.add("host-a", ["example/demo"])  # the README's scope for the example host
    kit.add("host-o", ["other/*"])
    data = tmp_path / "data"
    data.mkdir()
    with http_server(data, kit, offline_env) as srv:
        first = run_example(srv.url, kit.root, "host-a", offline_env)
        assert first.returncode == 0, first.stdout + first.stderr
        lines = first.stdout.splitlines()
        at = 0
        for expected in STEPS:  # every step, in order
            at = next((i for i in range(at, len(lines)) if lines[i].startswith(expected)), -1)
            assert at >= 0, f"missing {expected!r} in:\n{first.stdout}"
        assert "asks its human to confirm the withdraw" in first.stdout
        assert "asks its human to confirm the forget" in first.stdout
        assert first.stderr == ""

        again = run_example(srv.url, kit.root, "host-a", offline_env)  # a second run is a new lifecycle
        assert again.returncode == 0, again.stdout + again.stderr
        assert "lifecycle complete" in again.stdout

        wrong = run_example(srv.url, kit.root, "host-b", offline_env)  # no such key: one line, exit 1
        assert wrong.returncode == 1 and wrong.stdout == ""
        assert wrong.stderr.startswith("example host: error: ") and len(wrong.stderr.splitlines()) == 1

        outside = run_example(srv.url, kit.root, "host-o", offline_env)  # a key for other scopes only
        assert outside.returncode == 1 and outside.stdout.count("[") <= 1
        assert "Trusted invocation context unavailable" in outside.stderr
        assert "is example/demo among the scopes of host host-o" in outside.stderr
