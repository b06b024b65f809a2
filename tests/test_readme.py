"""The README, exercised as written: its commands and samples are read out of README.md.

The install half of the first command is what CI itself runs on a clean clone (`.ci/run`
is the README's second command); here the server half runs as a newcomer would start it,
and a real SDK client walks capture -> admission -> search -> get through it.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from tests.conftest import REPO, Human, capture_args, check_result, key
from tests.http_fixtures import free_port, wait_healthy

pytestmark = pytest.mark.anyio
README = (REPO / "README.md").read_text(encoding="utf-8")


def blocks(lang: str) -> list[str]:
    return re.findall(r"^ *```" + lang + r"\n(.*?)^ *```", README, flags=re.S | re.M)


def first_serve_command() -> list[str]:
    setup = blocks("bash")[0].strip()
    serve = setup.split("&&")[-1].strip()
    argv = shlex.split(serve)
    assert argv[:2] == ["engram-memory", "serve"], setup
    return argv


def test_the_setup_commands_are_the_two_the_readme_promises() -> None:
    first, second = (b.strip() for b in blocks("bash")[:2])
    assert first.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install -e . && engram-memory serve")
    assert second == "bash .ci/run"
    ci = (REPO / ".ci" / "run").read_text()
    assert "pip install -q -e '.[test,eval]'" in ci and "python -m pytest" in ci


def test_the_desktop_config_launches_the_same_command() -> None:
    config = json.loads(blocks("json")[0])
    server = config["mcpServers"]["engram-memory"]
    assert server["command"].endswith("/.venv/bin/engram-memory")
    assert server["args"] == first_serve_command()[1:]


async def newcomer_session(argv: list[str], env: dict[str, str], purpose: str) -> None:
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=str(REPO))
    human = Human()  # the TOML sample also confirms capture through the human
    async with stdio_client(params) as (read, write), \
            ClientSession(read, write, elicitation_callback=human) as session:
        await session.initialize()
        names = [t.name for t in (await session.list_tools()).tools]
        assert "engram_memory_capture" in names
        cap = check_result(await session.call_tool(
            "engram_memory_capture", capture_args("The README's first command serves a working memory.",
                                                  purpose=purpose)))
        candidate_id = cap["output"]["value"]["candidate_id"]
        adm = check_result(await session.call_tool(
            "engram_memory_request_admission", {"candidate_id": candidate_id, "idempotency_key": key("readme")}))
        record_id = adm["output"]["value"]["outcome"]["record_id"]
        found = check_result(await session.call_tool(
            "engram_memory_search", {"query": "README first command memory", "purpose_ref": purpose}))
        assert record_id in [p["record"]["record_id"] for p in found["output"]["value"]["records"]]
        got = check_result(await session.call_tool(
            "engram_memory_get", {"record_id": record_id, "purpose_ref": purpose}))
        assert got["ok"]


async def test_the_first_command_serves_the_lifecycle(tmp_path: Path, offline_env: dict[str, str]) -> None:
    argv = first_serve_command()
    purpose = argv[argv.index("--purpose-ref") + 1]
    # The README's default data dir, under a throwaway XDG_DATA_HOME; the installed entry point.
    env = {**offline_env, "XDG_DATA_HOME": str(tmp_path)}
    exe = Path(sys.executable).with_name("engram-memory")
    await newcomer_session([str(exe), *argv[1:]], env, purpose)
    assert (tmp_path / "engram-memory" / "engram.duckdb").exists()


async def test_the_toml_sample_parses_and_serves(tmp_path: Path, offline_env: dict[str, str]) -> None:
    sample = next(b for b in blocks("toml") if "data_dir" in b)
    text = sample.replace('"/srv/engram/acme"', json.dumps(str(tmp_path / "acme")))
    config = tmp_path / "engram.toml"
    config.write_text(text, encoding="utf-8")
    argv = [sys.executable, "-m", "engram_memory.server.cli", "serve", "--config", str(config)]
    purpose = re.search(r'^purpose_ref = "(.*)"', text, flags=re.M)
    assert purpose is not None
    # The sample grants search/get/capture/request_admission: the same walk works.
    await newcomer_session(argv, offline_env, purpose.group(1))


def test_the_http_example_connects(tmp_path: Path, offline_env: dict[str, str]) -> None:
    block = next(b for b in blocks("bash") if "host keygen" in b and "examples/host.py" in b)
    lines = [ln.split("  #")[0].strip() for ln in block.strip().splitlines()]
    keygen, serve, host = (shlex.split(ln.rstrip("&").strip()) for ln in lines)
    port = str(free_port())

    home = tmp_path / "home"

    def local(argv: list[str]) -> list[str]:
        exe = {"engram-memory": [sys.executable, "-m", "engram_memory.server.cli"], "python": [sys.executable]}
        out = [str(home / a[2:]) if a.startswith("~/") else a for a in exe.get(argv[0], [argv[0]]) + argv[1:]]
        return [a.replace("8765", port) if a.startswith(("127.0.0.1:", "http://")) else a for a in out]

    subprocess.run(local(keygen), cwd=tmp_path, env=offline_env, check=True, capture_output=True, timeout=60)
    proc = subprocess.Popen(local(serve), cwd=tmp_path, env=offline_env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        ran = subprocess.run([*local(host)[:1], str(REPO / host[1]), *local(host)[2:]], cwd=tmp_path,
                             env=offline_env, capture_output=True, text=True, timeout=120)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "NOT_FOUND" in ran.stdout  # the walk ends with the forgotten record gone


def test_readme_commands_name_real_flags(offline_env: dict[str, str]) -> None:
    """Every `engram-memory <command> --flag` in the README is a flag that command accepts."""
    helps: dict[str, str] = {}
    for block in blocks("bash"):
        for line in block.splitlines():
            if "engram-memory " not in line:
                continue
            words = shlex.split(line.split("  #")[0].replace("&", " "), comments=True)
            for i, word in enumerate(words):
                if word != "engram-memory" or i + 1 >= len(words):
                    continue
                command = words[i + 1:i + 3] if words[i + 1] in ("host", "admin") else words[i + 1:i + 2]
                name = " ".join(command)
                if name not in helps:
                    done = subprocess.run([sys.executable, "-m", "engram_memory.server.cli", *command, "--help"],
                                          env={**offline_env, "COLUMNS": "300"}, capture_output=True, text=True,
                                          timeout=60)
                    assert done.returncode == 0, (name, done.stderr)
                    helps[name] = done.stdout
                for flag in (w for w in words[i + 1:] if w.startswith("--")):
                    assert flag.split("=")[0] in helps[name], (name, flag)


def test_the_eval_sample_named_in_the_readme_is_in_the_clone() -> None:
    block = next(b for b in blocks("bash") if "eval/sample" in b)
    argv = shlex.split(block.strip())
    dataset = REPO / argv[argv.index("--dataset") + 1]
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "README.md"):
        assert (dataset / name).is_file(), name
    # The run itself is tests/test_eval_cli_errors.py's positive case (same command, one thread).


def test_the_documented_search_floor_and_fusion_are_the_engine_defaults() -> None:
    """The README and the search tool's description state the floor and the default fusion the engine uses."""
    from engram_memory.models.limits import SEMANTIC_FLOOR
    from engram_memory.models.settings import EngineSettings
    from engram_memory.server.tools import DESCRIPTIONS

    assert f"cosine ≥ {SEMANTIC_FLOOR}" in README and "semantic_floor" in DESCRIPTIONS["search"]
    lexical, semantic = EngineSettings().fusion_weights
    assert EngineSettings().fusion == "dbsf" and f"**DBSF, weights {lexical}/{semantic}**" in README


def test_the_documented_rerank_stage_is_the_engine_default() -> None:
    """The README and the search description name the stage the engine runs, its head and weights."""
    from engram_memory.models.limits import RERANK_HEAD, RERANK_WEIGHTS
    from engram_memory.models.settings import EngineSettings
    from engram_memory.server.tools import DESCRIPTIONS

    weights = dict(RERANK_WEIGHTS)
    assert EngineSettings().rerank and "fusion.rerank" in DESCRIPTIONS["search"]
    assert f"top {RERANK_HEAD}" in README
    assert f"speaker {weights['speaker']:g}, neighbour {weights['neighbour']:g}" in README


def test_readme_python_modules_take_their_flags(offline_env: dict[str, str]) -> None:
    """Every `python -m engram_memory.<module>` or `python -m studies.<study>` (run from a clone) in the
    README runs --help and knows the flags it is given."""
    seen = 0
    for block in blocks("bash"):
        for line in block.splitlines():
            words = shlex.split(line.split("  #")[0], comments=True)
            runnable = len(words) >= 3 and words[2].startswith(("engram_memory.", "studies."))
            if words[:2] != ["python", "-m"] or not runnable:
                continue
            done = subprocess.run([sys.executable, "-m", words[2], "--help"], env={**offline_env, "COLUMNS": "300"},
                                  cwd=REPO, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, (words[2], done.stderr)
            for flag in (w for w in words[3:] if w.startswith("--")):
                assert flag.split("=")[0] in done.stdout, (words[2], flag)
            seen += 1
    assert seen >= 3
