"""A newcomer's path, end to end: a clean clone, the README's first command in a fresh venv (no torch
comes with it), then a real SDK client doing capture -> admission -> search -> get through the server
it started, and a hybrid search once the model is ready.

This is the one test that installs: a couple of minutes (pip reuses its wheel cache, so
hnswlib is compiled once per machine). The install half of the README's command runs as
written; its server half runs under the SDK's stdio client, which is how a host starts it.
"""

from __future__ import annotations

import json
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_readme import blocks, http_example, newcomer_session

pytestmark = pytest.mark.anyio


async def test_a_newcomer_installs_and_runs_the_lifecycle(tmp_path: Path, offline_env: dict[str, str]) -> None:
    if shutil.which("git") is None:
        pytest.fail("git is needed to clone the repository as a newcomer would")
    clone = tmp_path / "engram-memory"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    first = blocks("bash")[0].strip()
    install, serve = first.rsplit("&&", 1)
    env = {k: v for k, v in offline_env.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONHOME"))}
    env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":") if ".venv" not in p)
    t0 = time.monotonic()
    done = subprocess.run(["bash", "-c", install.strip()], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    seconds = time.monotonic() - t0
    venv = clone / ".venv"
    assert (venv / "bin" / "engram-memory").exists()
    # The default install has no torch (the README says so): nor transformers, sentence-transformers or CUDA.
    listed = subprocess.run([str(venv / "bin" / "pip"), "list", "--format=json"], capture_output=True, text=True,
                            check=True)
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert not names & {"torch", "transformers", "sentence-transformers"}, sorted(names)
    assert not [n for n in names if n.startswith("nvidia-")], "the install pulled CUDA packages"

    argv = shlex.split(serve.strip())
    assert argv[0] == "engram-memory"
    purpose = argv[argv.index("--purpose-ref") + 1]
    run_env = {**env, "XDG_DATA_HOME": str(tmp_path / "xdg")}
    # An empty model cache: the first launch builds the model's graph, then search runs hybrid.
    run_env["ENGRAM_MODEL_CACHE"] = str(tmp_path / "model-cache")
    await newcomer_session([str(venv / "bin" / "engram-memory"), *argv[1:]], run_env, purpose, hybrid=True)
    assert (tmp_path / "xdg" / "engram-memory" / "engram.duckdb").exists()
    print(f"newcomer install: {seconds:.0f} s")
    http_first_steps(clone, venv / "bin" / "engram-memory", {**run_env, "HOME": str(tmp_path / "home")})


def http_first_steps(clone: Path, exe: Path, env: dict[str, str]) -> None:
    """The HTTP guide's keys stay out of the work tree; a busy port is one line and creates nothing."""
    block = http_example()
    keygen = shlex.split(block.strip().splitlines()[0].split("  #")[0])
    home = Path(env["HOME"])
    argv = [str(exe), *(str(home / a[2:]) if a.startswith("~/") else a for a in keygen[1:])]
    made = subprocess.run(argv, cwd=clone, env=env, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0 and made.stderr == "", made.stderr
    host_keys = home / ".config" / "engram-memory" / "keys" / "host-keys.toml"
    assert host_keys.exists()
    # Keys written into the clone as older instructions did: ignored, so no warning either.
    inside = subprocess.run([str(exe), "host", "keygen", "--out", "keys", "--kid", "host-a", "--scope", "*/*"],
                            cwd=clone, env=env, capture_output=True, text=True, timeout=120)
    assert inside.returncode == 0 and "warning" not in inside.stderr, inside.stderr
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True)
    assert status.stdout == "", status.stdout
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        data_dir = clone / "http-data"
        served = subprocess.run([str(exe), "serve", "--http", f"127.0.0.1:{port}", "--data-dir", str(data_dir),
                                 "--host-keys", str(host_keys)], cwd=clone, env=env, capture_output=True,
                                text=True, timeout=120)
    assert served.returncode == 2, served
    assert served.stderr == (f"engram-memory: error: cannot listen on http://127.0.0.1:{port}/mcp:"
                             " Address already in use\n"), served.stderr
    assert not data_dir.exists()
