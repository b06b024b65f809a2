"""What users install: the wheel built from this checkout, in a fresh venv outside the source tree.

The install has no ``-e``, no ``PYTHONPATH`` into the clone and no torch; the tests below run the
golden transcript over stdio, a hybrid search, ``admin verify`` and ``console --help`` against it
(its servers are the venv's; the MCP client is this process's SDK). A module left out of the wheel,
a template or corpus it does not carry, or a dependency only the development venv has, fails here.
Building and installing take about a minute with a warm pip cache (CI's dev install warms it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import anyio
import pytest

from engram_memory.eval.install import TORCH_STACK, Installed, build_wheel, install_fresh
from tests.conftest import ALL, CONTEXT, REPO, capture_args, key, mcp_server, search_args

pytestmark = pytest.mark.anyio
FOLDERS = ("models", "store", "retrieval", "server", "eval", "checks")
VENV_GUARD_MB = 485


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(REPO, work)
    return install_fresh(wheel, work / "venv")


def run(installed: Installed, *argv: str, env: dict[str, str] | None = None, cwd: Path | None = None
        ) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(installed.command), *argv], env={**base, "HF_HUB_OFFLINE": "1", **(env or {})},
                          capture_output=True, text=True, timeout=600, cwd=str(cwd or installed.venv))


def test_every_module_and_data_file_is_in_the_wheel(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", *FOLDERS], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    # The measured results kept in eval/ are for readers of the repository (MANIFEST.in leaves them out).
    results = re.compile(r"^eval/(BENCH-.*\.md|RESULTS\.md|bench-.*\.json|profile-.*\.txt)$")
    missing = [f for f in tracked if not results.match(f) and f"engram_memory/{f}" not in names]
    assert not missing, f"{len(missing)} tracked files are not in the wheel, e.g. {missing[:5]}"
    assert not [n for n in names if n.startswith(("tests/", "studies/", "engram_memory/tests"))]


def test_the_installed_package_is_the_wheel_not_the_clone(installed: Installed) -> None:
    done = subprocess.run([str(installed.python), "-c", "import engram_memory.store.duckdb.backend as m; "
                           "print(m.__file__)"], capture_output=True, text=True, cwd=str(installed.venv),
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(installed.venv)), done.stdout


def test_the_default_install_has_no_torch_and_fits_its_budget(installed: Installed) -> None:
    packages = installed.packages()
    assert not [p for p in TORCH_STACK if p in packages], sorted(packages)
    assert not [p for p in packages if p.startswith("nvidia-")]
    for needed in ("onnxruntime", "tokenizers", "safetensors", "protobuf"):
        assert needed in packages, needed
    assert "onnx" not in packages  # the graph is written with ONNX's schema through protobuf alone
    size = installed.size_mb()
    print(f"venv {size:.0f} MB, install {installed.seconds:.1f} s")
    # A guard against weight creeping back (torch alone is 754 MB), set just above today's 476 MB; the
    # issue's 450 MB target and the ratio to it are measured by `engram-memory bench-install`.
    assert size <= VENV_GUARD_MB, f"the default install is {size:.0f} MB"


def test_version_prints_the_package_version(installed: Installed) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    done = run(installed, "--version")
    assert done.returncode == 0 and done.stdout == f"engram-memory {version}\n", done


def test_console_help_and_the_plugged_in_commands_load(installed: Installed) -> None:
    done = run(installed, "console", "--help")
    assert done.returncode == 0 and "--data-dir" in done.stdout, done.stderr
    listed = run(installed, "--help")
    assert listed.returncode == 0 and "bench-install" in listed.stdout and "admin" in listed.stdout
    # The evaluation extra is not installed: its command says how to get it, in one line.
    evaluated = run(installed, "eval", "--out", "x", "--dataset", "y")
    assert evaluated.returncode == 2 and "pip install 'engram-memory[eval]'" in evaluated.stderr
    assert "Traceback" not in evaluated.stderr


def test_postgresql_is_an_extra_and_a_store_url_without_it_says_so(installed: Installed, tmp_path: Path) -> None:
    assert not {"psycopg", "psycopg-binary", "psycopg-pool"} & set(installed.packages())
    key = tmp_path / "master.key"
    key.write_bytes(b"k" * 32)
    data_dir = tmp_path / "data"
    for argv in (("serve", "--data-dir", str(data_dir)), ("admin", "verify")):
        done = run(installed, *argv, "--store", "postgresql://engram@127.0.0.1:5/engram",
                   "--master-key-file", str(key))
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip().splitlines()[-1].endswith(
            "PostgreSQL support is not installed: pip install 'engram-memory[postgres]'"), done.stderr
    assert not data_dir.exists()


def test_a_model_the_builder_cannot_express_names_the_torch_extra(installed: Installed, tmp_path: Path) -> None:
    model = Path(subprocess.run([str(installed.python), "-c", "from engram_memory.retrieval.embedder import "
                                 "PACKAGED_MODEL_DIR as d; print(d)"], capture_output=True, text=True,
                                check=True, cwd=str(installed.venv)).stdout.strip())
    assert model.is_relative_to(installed.venv), model
    for item in model.iterdir():
        if item.name != "config.json":
            (tmp_path / "model").mkdir(exist_ok=True)
            (tmp_path / "model" / item.name).symlink_to(item)
    config = json.loads((model / "config.json").read_text())
    (tmp_path / "model" / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    data_dir = tmp_path / "data"
    done = run(installed, "serve", "--data-dir", str(data_dir), "--model-path", str(tmp_path / "model"),
               env={"ENGRAM_MODEL_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"engram-memory: error: model_path {tmp_path / 'model'} does not load: architecture 'gpt2' is not one"
        " the ONNX builder assembles; this model needs the torch runtime: pip install 'engram-memory[torch]'")
    assert not data_dir.exists()
    torch_asked = run(installed, "serve", "--data-dir", str(data_dir), env={"ENGRAM_EMBEDDER_RUNTIME": "torch"})
    assert torch_asked.returncode == 2 and torch_asked.stderr.strip().splitlines()[-1] == (
        "engram-memory: error: embedder_runtime torch needs sentence-transformers: pip install"
        " 'engram-memory[torch]'"), torch_asked.stderr


async def test_a_hybrid_search_then_admin_verify(installed: Installed, tmp_path: Path) -> None:
    """The installed server, an empty model cache: the graph is assembled from the packaged weights, a
    search that requires both channels ranks with them, and the store verifies."""
    data_dir = tmp_path / "data"
    argv = [str(installed.command), "serve", "--data-dir", str(data_dir), "--tools", ALL]
    for name, value in CONTEXT.items():
        argv += ["--" + name.replace("_", "-"), value]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update({"HF_HUB_OFFLINE": "1", "ENGRAM_MODEL_CACHE": str(tmp_path / "cache")})
    async with mcp_server(argv, env) as mcp:
        for text in ("The deploy pipeline runs the database migration before the web tier restarts.",
                     "Lunch orders go to the kitchen by eleven on Fridays."):
            cap = await mcp.call("capture", capture_args(text))
            adm = await mcp.call("request_admission", {"candidate_id": cap["output"]["value"]["candidate_id"],
                                                       "idempotency_key": key("admit")})
            assert adm["output"]["value"]["outcome"]["status"] == "accepted", adm
        hybrid = {"minimum_channels": "lexical_and_semantic", "network": "forbid"}
        for _ in range(600):  # the model loads in the background: RANKING_UNAVAILABLE until then
            found = await mcp.call("search", search_args("when is the schema changed during a release",
                                                         capability_policy=hybrid))
            if found["ok"]:
                break
            assert found["error"]["code"] == "RANKING_UNAVAILABLE", found
            await anyio.sleep(0.1)
        value = found["output"]["value"]
        assert "migration" in value["records"][0]["record"]["components"][0]["text"]
        channels = {c["channel"]: c for c in value["rank_receipt"]["channels"]}
        assert channels["semantic"]["model_runtime"] == "onnxruntime-1.32.0/fp32", channels
    assert "torch" not in installed.packages()
    verified = run(installed, "admin", "verify", "--data-dir", str(data_dir), "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_the_golden_transcript_against_the_installed_server(installed: Installed) -> None:
    """tests/test_golden_transcript.py, its servers run by the wheel's venv (conftest.SERVER_PYTHON).

    The default install has no PostgreSQL driver (the `postgres` extra), so the DuckDB transcript runs
    here; the PostgreSQL one runs in the suite's own install."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["ENGRAM_TEST_SERVER_PYTHON"] = str(installed.python)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_golden_transcript.py", "-k", "not postgres"], cwd=REPO, env=env,
                          capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " skipped" not in done.stdout, done.stdout[-500:]
