"""The store's folders and what each may import (docs/design.md, "Inside store/").

Read from the source with ``ast`` (every import, top level or inside a function). ``models`` and
``retrieval`` are always allowed (tests/test_packaging.py checks the layers between packages); this
file checks the folders inside ``store/``: a concern is found by its folder's name, its
``__init__.py`` says what it holds, and imports between folders go the ways the table says."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STORE = REPO / "store"
NAMESPACE = "engram_memory.store"

# Each unit of store/ (a folder, or one of the two top modules) -> the units it may import.
ALLOWED: dict[str, set[str]] = {
    "screen": set(),
    "backend": set(),
    "core": {"screen", "backend", "opening"},
    "host": {"core", "screen", "backend", "opening"},
    "maintenance": {"core", "host", "backend", "opening"},
    "console": {"core", "host", "maintenance", "backend"},
    "duckdb": {"core", "backend"},
    "postgres": {"core", "backend", "duckdb"},  # migrate reads a DuckDB store; export writes one
    "opening": {"backend", "duckdb", "postgres"},  # the one place that names a backend
}


def unit_of(path: Path, root: Path = STORE) -> str:
    rel = path.relative_to(root)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported_units(path: Path) -> dict[str, int]:
    """The store units a module imports -> the first line doing so."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
            if node.module == NAMESPACE:  # from engram_memory.store import core
                names = [f"{NAMESPACE}.{alias.name}" for alias in node.names]
        for name in names:
            if name.startswith(NAMESPACE + "."):
                found.setdefault(name.split(".")[2], node.lineno)
    return found


def violations(root: Path = STORE) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "__init__.py" and path.parent == root:
            continue
        me = unit_of(path, root)
        for unit, line in imported_units(path).items():
            if unit != me and unit not in ALLOWED.get(me, set()):
                out.append(f"store/{path.relative_to(root)}:{line}: store/{me} imports store/{unit}")
    return out


def test_every_unit_of_the_store_is_listed() -> None:
    units = {unit_of(p) for p in STORE.rglob("*.py") if p != STORE / "__init__.py"}
    assert units == set(ALLOWED), f"add each new folder to ALLOWED and docs/design.md: {sorted(units ^ set(ALLOWED))}"


def test_each_folder_imports_only_what_its_row_allows() -> None:
    found = violations()
    assert found == [], "\n".join(found)


@pytest.mark.parametrize("folder", sorted(p.name for p in STORE.iterdir() if (p / "__init__.py").is_file()))
def test_each_folder_says_what_it_holds(folder: str) -> None:
    doc = ast.get_docstring(ast.parse((STORE / folder / "__init__.py").read_text(encoding="utf-8")))
    assert doc and len(doc) > 40, f"store/{folder}/__init__.py needs a docstring saying what it holds"


def test_the_check_sees_a_wrong_way_import(tmp_path: Path) -> None:
    """A screen module importing the engine is found (the check is not vacuous)."""
    (tmp_path / "screen").mkdir()
    (tmp_path / "screen" / "x.py").write_text("def f():\n    from engram_memory.store.core.engine import Engine\n",
                                             encoding="utf-8")
    assert violations(tmp_path) == ["store/screen/x.py:2: store/screen imports store/core"]
