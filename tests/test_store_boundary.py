"""The store boundary (store/backend.py): SQL and the database drivers live in the backends only
(store/duckdb/, and store/postgres/ once it implements the protocols).

The engine, lifecycle rules, policy, crypto, the read path and the server ask the store through
the ``Store`` / ``UnitOfWork`` protocols, so a second backend is a second folder, not a patch."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BACKEND = REPO / "store" / "duckdb"
BACKENDS = (BACKEND, REPO / "store" / "postgres")
DRIVERS = {"duckdb", "psycopg", "psycopg_pool"}
SQL = re.compile(r"\b(SELECT .* FROM|INSERT INTO|UPDATE \w+ SET|DELETE FROM|CREATE TABLE|ALTER TABLE)\b")


def _sources(folder: str) -> list[Path]:
    return sorted(p for p in (REPO / folder).rglob("*.py") if not any(b in p.parents for b in BACKENDS))


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] in DRIVERS for a in node.names):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: imports a database driver")
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in DRIVERS:
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: imports from a database driver")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in {"execute", "executemany", "sql"}):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: .{node.func.attr}(")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.search(node.value):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: SQL text")
    return found


@pytest.mark.parametrize("folder", ["store", "server"])
def test_no_sql_or_driver_outside_the_backends(folder: str) -> None:
    offences = [o for path in _sources(folder) for o in _offences(path)]
    assert offences == [], "\n".join(offences)


def test_the_backend_folder_is_where_the_sql_is() -> None:
    assert any(_offences(p) for p in BACKEND.rglob("*.py")), "the check would no longer see SQL"
