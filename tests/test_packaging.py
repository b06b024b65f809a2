"""The shape of the code and of the installed distribution.

* The import graph is one way: server -> store -> retrieval -> models, eval -> store, checks -> eval.
  Read from the source with ``ast`` (every import, top level or inside a function).
* The installed distribution puts nothing generic at the top of site-packages.
"""

from __future__ import annotations

import ast
import sysconfig
from importlib.metadata import Distribution, distributions
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "engram_memory"

# What each package may import of ours (itself always).
ALLOWED: dict[str, set[str]] = {
    "models": set(),
    "retrieval": {"models"},
    "store": {"retrieval", "models"},
    "server": {"store", "retrieval", "models"},
    "eval": {"store", "retrieval", "models"},
    "checks": {"eval", "store", "retrieval", "models"},
}


def imported_packages(path: Path) -> set[str]:
    """Our packages a module imports (absolute imports under the namespace; relative ones too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path}: relative import; use {NAMESPACE}.<package>")
            names = [node.module or ""]
        for name in names:
            parts = name.split(".")
            if parts[0] == NAMESPACE and len(parts) > 1:
                found.add(parts[1])
            elif parts[0] in ALLOWED:
                raise AssertionError(f"{path}: imports top-level {parts[0]!r}; use {NAMESPACE}.{parts[0]}")
    return found


def test_import_graph_is_one_way() -> None:
    violations = []
    for package, allowed in ALLOWED.items():
        for path in sorted((REPO / package).rglob("*.py")):
            for target in imported_packages(path) - allowed - {package}:
                violations.append(f"{path.relative_to(REPO)} imports {NAMESPACE}.{target}")
    assert not violations, "\n".join(violations)


def test_the_checker_catches_a_violation(tmp_path: Path) -> None:
    """The graph test would fail on a retrieval module importing store (it is not vacuous)."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from engram_memory.store.core.engine import Engine\n", encoding="utf-8")
    assert imported_packages(bad) == {"store"}
    assert "store" not in ALLOWED["retrieval"]
    with pytest.raises(AssertionError):
        bad.write_text("import store.engine\n", encoding="utf-8")
        imported_packages(bad)


GENERIC = {"models", "store", "retrieval", "server", "eval", "checks", "studies", "tests"}


def installed_distribution() -> Distribution:
    """engram-memory as installed in site-packages (not the egg-info an editable build leaves in the clone)."""
    paths = sysconfig.get_paths()
    site = sorted({paths["purelib"], paths["platlib"]})
    found = [d for d in distributions(path=site) if d.metadata["Name"] == "engram-memory"]
    assert found, f"engram-memory is not installed in {site}"
    return found[0]


def top_level_names() -> set[str]:
    """Top-level import names the installed distribution provides, from its metadata."""
    dist = installed_distribution()
    names: set[str] = set()
    top_level = dist.read_text("top_level.txt")
    if top_level:
        names |= {line.strip() for line in top_level.splitlines() if line.strip()}
    for file in dist.files or []:
        first = file.parts[0]
        if first.endswith((".dist-info", ".egg-info")) or first in ("..", "__pycache__"):
            continue
        names.add(first.removesuffix(".py").removesuffix(".pth"))
    return names


def test_no_generic_top_level_package_is_installed() -> None:
    names = top_level_names()
    assert not names & GENERIC, f"generic top-level names installed: {sorted(names & GENERIC)}"


def test_the_namespace_is_what_is_importable() -> None:
    import importlib

    for package in ALLOWED:
        module = importlib.import_module(f"{NAMESPACE}.{package}")
        assert Path(module.__path__[0]).resolve() == (REPO / package).resolve() or "site-packages" in str(
            module.__path__[0]
        )


@pytest.mark.parametrize("name", sorted(GENERIC - {"tests", "studies"}))
def test_generic_names_do_not_import_outside_the_clone(name: str, tmp_path: Path) -> None:
    """From a neutral directory, `import models` (etc.) finds nothing of ours."""
    import subprocess
    import sys

    probe = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.find_spec({name!r})\n"
        "origin = spec.origin if spec else None\n"
        f"sys.exit(1 if origin and {str(REPO)!r} in str(origin) else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{name} resolves into the repository: {done.stderr}"


def test_eval_without_its_extra_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import importlib.util

    import typer

    from engram_memory.eval import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ranx" else real(name, *a))
    with pytest.raises(typer.Exit) as exit_info:
        cli.require_eval_extra()
    assert exit_info.value.exit_code == 2
    err = capsys.readouterr().err
    assert "pip install 'engram-memory[eval]'" in err and "Traceback" not in err and err.count("\n") == 1


def test_the_cli_lists_eval_through_the_entry_point() -> None:
    from typer.testing import CliRunner

    from engram_memory.server.cli import app

    out = CliRunner().invoke(app, ["--help"]).output
    assert "eval" in out and "bench" in out and "serve" in out


def test_a_serving_process_never_loads_the_plugged_in_commands() -> None:
    """`serve` holds no evaluation stack or PostgreSQL driver for a DuckDB store (13 MiB), nor does
    any other built-in command; a plugged-in command loads itself only, and help (or a mistyped
    command) lists them all."""
    import subprocess
    import sys

    modules = ('engram_memory.eval.cli', 'engram_memory.checks.fuzz', 'psycopg', 'ranx', 'numpy')
    probe = ("import sys; sys.argv = ['engram-memory', *sys.argv[1:]]; import engram_memory.server.cli; "
             f"print(sorted(m for m in {modules!r} if m in sys.modules))")
    # psycopg (the `postgres` extra) is imported only by a command given a PostgreSQL store
    every = "['engram_memory.checks.fuzz', 'engram_memory.eval.cli', 'numpy']"
    for argv, loaded in ((["serve", "--help"], "[]"), (["admin", "verify", "--help"], "[]"),
                         (["host", "--help"], "[]"), (["--help"], every), (["evl"], every),
                         (["bench", "--help"], "['engram_memory.eval.cli']"),
                         (["fuzz", "--help"], "['engram_memory.checks.fuzz']")):
        done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == loaded, argv


def test_the_wheel_ships_what_its_commands_read_and_no_study(tmp_path: Path) -> None:
    """eval-secrets reads its corpora from the package (a wheel has no clone beside it); the
    studies and their results stay in the repository."""
    import shutil
    import subprocess
    import sys
    import zipfile

    # Built from a copy: setuptools writes build/ and egg-info beside the sources it builds.
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "out",
                                                                 "data", ".mypy_cache", "__pycache__"))
    # The build backend called as pip calls it, its output kept: pip 26 (what the README's command
    # installs first) shows a newcomer every warning it prints on each `pip install .` -- there must be
    # none (data folders are listed as namespace packages, the licence is an SPDX string).
    done = subprocess.run([sys.executable, "-W", "default", "-c",
                           "import sys, setuptools.build_meta as b; b.build_wheel(sys.argv[1])",
                           str(tmp_path)], cwd=source, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    warned = [line for line in done.stderr.splitlines() if "Warning: " in line]  # warnings.warn's form
    assert not warned, warned
    [wheel] = tmp_path.glob("engram_memory-*.whl")
    entries = zipfile.ZipFile(wheel).infolist()
    names = {entry.filename for entry in entries}
    # Stored, not deflated (setup.py): deflating the model's weights is most of a local build's time.
    assert {entry.compress_type for entry in entries} == {zipfile.ZIP_STORED}
    for shipped in ("engram_memory/checks/secrets/corpus.jsonl", "engram_memory/checks/secrets/probes.jsonl",
                    "engram_memory/checks/secrets_corpus.py", "engram_memory/eval/harness.py"):
        assert shipped in names, shipped
    assert not [n for n in names if n.startswith(("studies/", "tests/")) or "_study" in n], sorted(names)[:20]
