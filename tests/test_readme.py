"""The README and the guides, exercised as written: commands and samples are read out of the page
that shows them (README.md, the front page, and the guides under docs/).

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
import time
import unicodedata
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from typer.testing import CliRunner

from engram_memory.server.cli import app
from tests.conftest import REPO, Human, capture_args, check_result, key
from tests.http_fixtures import free_port, wait_healthy

pytestmark = pytest.mark.anyio


def page(name: str = "README.md") -> str:
    """One page of the documentation: README.md or a guide, `docs/NAME.md`."""
    return (REPO / name).read_text(encoding="utf-8")


# Every page: the front page first, then the guides.
PAGES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]


def blocks(lang: str, name: str = "README.md") -> list[str]:
    """The fenced code blocks of one language on one page, in order."""
    return re.findall(r"^ *```" + lang + r"\n(.*?)^ *```", page(name), flags=re.S | re.M)


def without_code(text: str) -> str:
    """A page without its fenced code blocks: its prose."""
    return re.sub(r"^ *```.*?^ *```", "", text, flags=re.S | re.M)


def all_blocks(lang: str) -> list[str]:
    """The fenced code blocks of one language on every page."""
    return [b for name in PAGES for b in blocks(lang, name)]


def first_serve_command() -> list[str]:
    setup = blocks("bash")[0].strip()
    serve = setup.split("&&")[-1].strip()
    argv = shlex.split(serve)
    assert argv[:2] == ["engram-memory", "serve"], setup
    return argv


def test_the_setup_commands_are_the_two_the_readme_promises() -> None:
    first, second = (b.strip() for b in blocks("bash")[:2])
    assert first.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install -U pip && pip install . "
                            "&& engram-memory serve")
    assert second == "bash .ci/run"
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^pip install -q -e '\.\[test,eval[\w,]*\]'$", ci, re.M) and "python -m pytest" in ci, ci


def test_the_desktop_config_launches_the_same_command() -> None:
    config = json.loads(blocks("json")[0])
    server = config["mcpServers"]["engram-memory"]
    assert server["command"].endswith("/.venv/bin/engram-memory")
    assert server["args"] == first_serve_command()[1:]


async def newcomer_session(argv: list[str], env: dict[str, str], purpose: str, hybrid: bool = False) -> None:
    """capture -> admission -> search -> get through the server ``argv`` starts; with ``hybrid``, also
    a search that needs both channels, retried while the model loads, answered by the hybrid profile."""
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
        if not hybrid:
            return
        both = {"minimum_channels": "lexical_and_semantic", "network": "forbid"}
        deadline = time.monotonic() + 180
        while True:
            answer = check_result(await session.call_tool("engram_memory_search", {
                "query": "what does the first command serve", "purpose_ref": purpose, "capability_policy": both}))
            if answer["ok"] or answer["error"]["code"] != "RANKING_UNAVAILABLE" or time.monotonic() > deadline:
                break
            await anyio.sleep(0.5)
        assert answer["ok"], answer
        value = answer["output"]["value"]
        assert value["rank_receipt"]["profile"] == "hybrid_v1", value["rank_receipt"]
        assert record_id in [p["record"]["record_id"] for p in value["records"]]


async def test_the_first_command_serves_the_lifecycle(tmp_path: Path, offline_env: dict[str, str]) -> None:
    argv = first_serve_command()
    purpose = argv[argv.index("--purpose-ref") + 1]
    # The README's default data dir, under a throwaway XDG_DATA_HOME; the installed entry point.
    env = {**offline_env, "XDG_DATA_HOME": str(tmp_path)}
    exe = Path(sys.executable).with_name("engram-memory")
    await newcomer_session([str(exe), *argv[1:]], env, purpose)
    assert (tmp_path / "engram-memory" / "engram.duckdb").exists()


async def test_the_toml_sample_parses_and_serves(tmp_path: Path, offline_env: dict[str, str]) -> None:
    sample = next(b for b in blocks("toml", "docs/configuration.md") if "data_dir" in b)
    text = sample.replace('"/srv/engram/acme"', json.dumps(str(tmp_path / "acme")))
    config = tmp_path / "engram.toml"
    config.write_text(text, encoding="utf-8")
    argv = [sys.executable, "-m", "engram_memory.server.cli", "serve", "--config", str(config)]
    purpose = re.search(r'^purpose_ref = "(.*)"', text, flags=re.M)
    assert purpose is not None
    # The sample grants search/get/capture/request_admission: the same walk works.
    await newcomer_session(argv, offline_env, purpose.group(1))


def http_example() -> str:
    """The guide's first HTTP commands: keygen, serve --http, the example host."""
    return next(b for b in blocks("bash", "docs/http.md") if "host keygen" in b and "examples/host.py" in b)


def test_the_http_example_connects(tmp_path: Path, offline_env: dict[str, str]) -> None:
    block = http_example()
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


def command_lines() -> list[tuple[str, str]]:
    """Every line that runs `engram-memory`, with its page: in the pages' bash blocks, and in their
    inline code spans (`engram-memory fuzz --calls 100000 ...`, which may wrap)."""
    found = []
    for name in PAGES:
        for block in blocks("bash", name):
            found += [(name, line.split("  #")[0]) for line in block.splitlines() if "engram-memory " in line]
        prose = without_code(page(name))
        found += [(name, " ".join(span.split())) for span in re.findall(r"`(engram-memory [^`]+)`", prose)]
    return found


def test_every_page_names_real_flags(offline_env: dict[str, str]) -> None:
    """Every `engram-memory <command> --flag` on the front page or in a guide is a flag that command accepts."""
    helps: dict[str, str] = {}
    lines = command_lines()
    pages = {name for name, _ in lines}
    assert {"README.md", "docs/maintenance.md", "docs/proofs.md", "docs/receipts.md"} <= pages, pages
    for name, line in lines:
        words = shlex.split(line.replace("&", " "), comments=True)
        for i, word in enumerate(words):
            if word != "engram-memory" or i + 1 >= len(words):
                continue
            command = words[i + 1:i + 3] if words[i + 1] in ("host", "admin") else words[i + 1:i + 2]
            key = " ".join(command)
            if key not in helps:
                # In process (the app `engram-memory` runs, its plug-in commands loaded): 40-odd
                # interpreters started only to print help cost a minute of the suite.
                done = CliRunner().invoke(app, [*command, "--help"], env={**offline_env, "COLUMNS": "300"})
                assert done.exit_code == 0, (name, key, done.output)
                helps[key] = done.output
            for flag in (w for w in words[i + 1:] if w.startswith("--")):
                assert flag.split("=")[0] in helps[key], (name, key, flag)


def test_links_between_pages_resolve() -> None:
    """Every relative link and image on the front page and in the guides names a file that exists (and,
    into a page, a heading it has). `mkdocs build --strict` checks the site the same way in CI."""
    seen = 0
    for name in PAGES:
        prose = without_code(page(name))
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            file = (REPO / name).parent / path if path else REPO / name
            assert file.is_file(), (name, target)
            if anchor:
                headings = re.findall(r"^#+ (.*)$", without_code(file.read_text(encoding="utf-8")), re.M)
                slugs = {heading_slug(h) for h in headings}
                assert anchor in slugs, (name, target)
            seen += 1
    assert seen >= 20


def heading_slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension gives a heading (its default slugify)."""
    text = unicodedata.normalize("NFKD", heading.replace("`", "")).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def test_the_eval_sample_named_in_the_readme_is_in_the_clone() -> None:
    block = next(b for b in blocks("bash", "docs/relevance-and-speed.md") if "eval/sample" in b)
    argv = shlex.split(block.strip())
    dataset = REPO / argv[argv.index("--dataset") + 1]
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "README.md"):
        assert (dataset / name).is_file(), name
    # The run itself is tests/test_eval_cli_errors.py's positive case (same command, one thread).


def test_the_documented_search_floor_and_fusion_are_the_engine_defaults() -> None:
    """The guides and the search tool's description state the floor and the default fusion the engine uses."""
    from engram_memory.models.limits import SEMANTIC_FLOOR
    from engram_memory.models.settings import EngineSettings
    from engram_memory.server.tools import DESCRIPTIONS

    relevance = page("docs/relevance-and-speed.md")
    assert f"cosine ≥ {SEMANTIC_FLOOR}" in page("docs/tools.md") and f"cosine ≥ {SEMANTIC_FLOOR}" in relevance
    assert "semantic_floor" in DESCRIPTIONS["search"]
    lexical, semantic = EngineSettings().fusion_weights
    assert EngineSettings().fusion == "dbsf" and f"**DBSF, weights {lexical}/{semantic}**" in relevance


def test_the_documented_rerank_stage_is_the_engine_default() -> None:
    """The guides and the search description name the stage the engine runs, its head and weights."""
    from engram_memory.models.limits import RERANK_HEAD, RERANK_WEIGHTS
    from engram_memory.models.settings import EngineSettings
    from engram_memory.server.tools import DESCRIPTIONS

    weights = dict(RERANK_WEIGHTS)
    assert EngineSettings().rerank and "fusion.rerank" in DESCRIPTIONS["search"]
    relevance = page("docs/relevance-and-speed.md")
    assert f"top {RERANK_HEAD}" in relevance and f"top {RERANK_HEAD}" in page("docs/configuration.md")
    assert f"speaker {weights['speaker']:g}, neighbour {weights['neighbour']:g}" in relevance


def test_readme_python_modules_take_their_flags(offline_env: dict[str, str]) -> None:
    """Every `python -m engram_memory.<module>` or `python -m studies.<study>` (run from a clone) on the
    front page or in a guide runs --help and knows the flags it is given."""
    seen, helps = 0, {}
    for block in all_blocks("bash"):
        for line in block.splitlines():
            words = shlex.split(line.split("  #")[0], comments=True)
            runnable = len(words) >= 3 and words[2].startswith(("engram_memory.", "studies."))
            if words[:2] != ["python", "-m"] or not runnable:
                continue
            # a sub-command (`python -m engram_memory.eval bench-import --items N`) has its own --help
            command = tuple(words[2:4] if len(words) > 3 and not words[3].startswith("-") else words[2:3])
            if command not in helps:
                done = subprocess.run([sys.executable, "-m", *command, "--help"], cwd=REPO, capture_output=True,
                                      env={**offline_env, "COLUMNS": "300"}, text=True, timeout=120)
                assert done.returncode == 0, (words[2], done.stderr)
                helps[command] = done.stdout
            for flag in (w for w in words[3:] if w.startswith("--")):
                assert flag.split("=")[0] in helps[command], (words[2], flag)
            seen += 1
    assert seen >= 3


# -- the front page's limits, against the code's constants ---------------------------------------


def limits_rows() -> dict[str, tuple[str, str]]:
    """The front page's "Limits an agent meets" table: what -> (bound, beyond it)."""
    section = page().split("## Limits an agent meets\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("|") and not line.startswith("|---")]
    assert rows[0] == ["what", "bound", "beyond it"], rows[0]
    return {what: (bound, beyond) for what, bound, beyond in rows[1:]}


def numbers(text: str) -> list[int]:
    return [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", text)]


def test_the_front_page_limits_are_the_codes() -> None:
    """Every bound the front page gives an agent is the constant the code enforces, and every error
    code it names is the one the catalog answers (and says retriable exactly when the catalog does)."""
    from engram_memory.models import limits as lim
    from engram_memory.models.errors import CATALOG, PROTOCOL_CONTEXT_CODE, PROTOCOL_UNKNOWN_TOOL_CODE, ErrorCode
    from engram_memory.models.tools import INPUT_MODELS
    from engram_memory.server.config import ServeSettings

    serve = ServeSettings.model_fields
    expected: dict[str, tuple[list[int], str]] = {
        "serialized arguments": ([lim.MAX_ARGUMENT_BYTES, lim.MAX_ARGUMENT_BYTES // lim.MIB], "INVALID_SCHEMA"),
        "`idempotency_key`": ([lim.IDEMPOTENCY_KEY_MIN_BYTES, lim.IDEMPOTENCY_KEY_MAX_BYTES], "INVALID_SCHEMA"),
        "references": ([1, lim.OPAQUE_MAX_BYTES], "INVALID_SCHEMA"),
        "search `query`": ([1, lim.QUERY_MAX_BYTES], "INVALID_SCHEMA"),
        "search `limit`": ([lim.LIMIT_MIN, lim.LIMIT_MAX, lim.LIMIT_DEFAULT], "INVALID_SCHEMA"),
        "`max_packet_bytes`": ([lim.PACKET_BYTES_MIN, lim.PACKET_BYTES_MAX, lim.PACKET_BYTES_DEFAULT],
                               "INVALID_SCHEMA"),
        "one record packet": ([], "PROJECTION_OVERSIZED"),
        "the whole search result": ([lim.RESULT_BOUND], "RESULT_TOO_LARGE"),
        "capture `components`": ([1, lim.MAX_COMPONENTS], "INVALID_SCHEMA"),
        "a component's `text`": ([1, lim.TEXT_MAX_BYTES], "INVALID_SCHEMA"),
        "capture `citations`": ([1, lim.MAX_CITATIONS], "INVALID_SCHEMA"),
        "`reconciliation.family_refs`": ([lim.MAX_FAMILY_REFS], "INVALID_SCHEMA"),
        "evidence `attestation`": ([lim.ATTESTATION_MAX_BYTES], "INVALID_SCHEMA"),
        "calls per principal": ([int(serve["rate_limit"].default), serve["rate_burst"].default, 0], "RATE_LIMITED"),
        "the human's confirmation": ([int(serve["confirm_ttl_seconds"].default), lim.CONFIRM_TTL_S], "gate_failed"),
        "the call after the human approved": ([lim.EXECUTION_WINDOW_S], "gate_failed"),
        "the same `idempotency_key`": ([], "DIGEST_CONFLICT"),
        "`purpose_ref` other than": ([], f"JSON-RPC `{PROTOCOL_CONTEXT_CODE}`"),
        "a tool the host did not grant": ([], f"JSON-RPC `{PROTOCOL_UNKNOWN_TOOL_CODE}`"),
        "`lexical_and_semantic`": ([], "RANKING_UNAVAILABLE"),
    }
    rows = limits_rows()
    matched: set[str] = set()
    for what, (bound, beyond) in rows.items():
        key = next((k for k in expected if what.startswith(k)), None)
        assert key is not None, f"a limit the test does not know: {what!r}"
        want_numbers, want_code = expected[key]
        matched.add(key)
        assert sorted(set(numbers(bound))) == sorted(set(want_numbers)), (what, bound, want_numbers)
        if want_code.startswith("JSON-RPC"):
            assert beyond == want_code, (what, beyond)
        else:
            code, _, rest = beyond.partition(", ")
            assert code == f"`{want_code}`", (what, beyond)
            assert (rest == "retriable") == CATALOG[ErrorCode(want_code)].retriable, (what, beyond)
    assert matched == set(expected), set(expected) - matched

    # The references the front page bounds at 1..512 bytes are the fields the schemas bound so.
    refs = re.findall(r"`(\w+)`", next(w for w in rows if w.startswith("references")))
    bounded: dict[str, set[int]] = {}

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for name, spec in (node.get("properties") or {}).items():
                if isinstance(spec, dict) and "maxLength" in spec:
                    bounded.setdefault(name, set()).add(spec["maxLength"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for model in INPUT_MODELS.values():
        walk(model.model_json_schema())
    assert refs and all(bounded.get(ref) == {lim.OPAQUE_MAX_BYTES} for ref in refs), {r: bounded.get(r) for r in refs}


def test_the_front_page_pins_are_the_projects() -> None:
    """A package pinned on the front page (`hnswlib==0.8.0`) is pinned so in pyproject.toml."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = {req.split("==")[0].split("[")[0].lower(): req.split("==")[1]
            for req in project["dependencies"] if "==" in req}
    named = re.findall(r"`([A-Za-z0-9_.-]+)==([\w.]+)`", page())
    assert named, "the front page names no pinned package"
    for name, version in named:
        assert pins.get(name.lower()) == version, (name, version, pins.get(name.lower()))


def test_the_tools_guide_names_every_code_and_its_retry_class() -> None:
    """docs/tools.md's "What the caller does" table lists every catalog code once, and the retriable
    row holds exactly the codes the catalog marks retriable."""
    from engram_memory.models.errors import CATALOG

    section = page("docs/tools.md").split("## What the caller does with each code\n", 1)[1]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| `")]
    listed = [re.findall(r"`([\w]+)`", codes) for codes, _ in rows]
    flat = [code for codes in listed for code in codes]
    assert sorted(flat) == sorted(code.value for code in CATALOG), sorted(set(flat) ^ {c.value for c in CATALOG})
    [retriable] = [codes for (codes, action) in zip(listed, (a for _, a in rows), strict=True)
                   if action.strip().startswith("retriable")]
    assert set(retriable) == {code.value for code, spec in CATALOG.items() if spec.retriable} - {
        "MUTATION_OUTCOME_UNKNOWN"}, retriable


def test_the_front_page_secrets_figures_are_the_proofs() -> None:
    """The front page's unseen figures are the latest blind round's first run in the Proofs table."""
    row = r"\| \*\*rules (0\.\d+) / 0\.\d+; rules \+ learned screen (0\.\d+) / (0\.\d+)\*\* \|"
    rules, recall, fpr = re.findall(row, page("docs/proofs.md"))[-1]
    front = r"it caught (\d+) %\s+of the secrets \(rules alone (\d+) %\) and refused ([\d.]+) % of look-alikes"
    said = re.findall(front, page())
    assert said == [(str(round(float(recall) * 100)), str(round(float(rules) * 100)), f"{float(fpr) * 100:.1f}")]
