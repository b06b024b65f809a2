"""The store boundary (store/backend.py): SQL and the database drivers live in the backends only
(store/duckdb/ and store/postgres/), and so does every backend-specific action.

The engine, lifecycle rules, policy, crypto, the read path and the server ask the store through
the ``Store`` / ``UnitOfWork`` protocols; the operator's tools (verify, history, rebuild, backup,
rotation, the console's reads, the admin commands, the benchmarks) through ``Inspector``,
``EmbeddedBackend`` and ``SharedBackend``, which store/opening.py hands out. So store/opening.py is
the one module outside the backends that imports one, and a third backend is a third folder plus
a line there, not a patch through every caller."""

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


# -- who imports a backend ---------------------------------------------------------------------
#
# checks/ and tests/ are exempt: they are harnesses that inspect raw storage (and provision
# throwaway PostgreSQL databases) on purpose, below the protocols, to check what the protocols hide.

PACKAGE = "engram_memory"
BACKEND_MODULES = (f"{PACKAGE}.store.duckdb", f"{PACKAGE}.store.postgres")
CHECKED = ("models", "retrieval", "store", "server", "eval")
OPENING = REPO / "store" / "opening.py"


def _module_of(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _is_backend(module: str) -> bool:
    return any(module == b or module.startswith(b + ".") for b in BACKEND_MODULES)


def backend_imports(path: Path, root: Path = REPO) -> list[str]:
    """Every import of a backend module in the file (top level or inside a function, absolute or
    relative, ``from engram_memory.store import duckdb`` included), as ``file:line: module``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module = _module_of(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        hits = sorted({n for n in names if _is_backend(n)})
        if hits:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {hits[0]}")
    return found


def _outside_the_backends(root: Path = REPO) -> list[Path]:
    backends = (root / "store" / "duckdb", root / "store" / "postgres")
    return sorted(p for folder in CHECKED for p in (root / folder).rglob("*.py")
                  if not any(b in p.parents for b in backends) and p != root / "store" / "opening.py"
                  and ".venv" not in p.parts)


def test_only_the_opening_module_imports_a_backend() -> None:
    offences = [o for path in _outside_the_backends() for o in backend_imports(path)]
    assert offences == [], "import the backend through store/opening.py:\n" + "\n".join(offences)


def test_the_backend_import_check_sees_a_planted_import(tmp_path: Path) -> None:
    """Not vacuous: planted imports (top level, in a function, relative, from the store package)
    are each found, and the opening module's own imports are seen too."""
    (tmp_path / "store" / "maintenance").mkdir(parents=True)
    planted = tmp_path / "store" / "maintenance" / "planted.py"
    planted.write_text(
        "import engram_memory.store.duckdb.backend\n"
        "from engram_memory.store import postgres\n"
        "def f():\n"
        "    from engram_memory.store.postgres.url import redact_url\n"
        "    from ..duckdb import inspect\n"
        "    from engram_memory.store.backend import Store  # not a backend\n"
        "    return redact_url, inspect, Store\n", encoding="utf-8")
    assert [o.split(": ", 1)[1] for o in backend_imports(planted, tmp_path)] == [
        "engram_memory.store.duckdb.backend", "engram_memory.store.postgres",
        "engram_memory.store.postgres.url", "engram_memory.store.duckdb"]
    assert _outside_the_backends(tmp_path) == [planted]
    assert backend_imports(OPENING), "the check no longer sees store/opening.py's own backend imports"


def test_a_duckdb_only_process_never_imports_psycopg(tmp_path: Path) -> None:
    """The opening module, every maintenance module and the DuckDB backend's kind load (and a
    PostgreSQL URL is told what to install) without psycopg: the PostgreSQL backend is lazy."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('psycopg', 'psycopg_pool'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from pathlib import Path\n"
        "from engram_memory.store import opening\n"
        "from engram_memory.store.maintenance import backup, rebuild, rotation, verify\n"
        "from engram_memory.store.host import history\n"
        "from engram_memory.store.console import console_reads\n"
        "opening.embedded().inspector\n"
        "try:\n"
        "    opening.check_store_options('postgresql://u@h/db', Path('k'))\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
        "print(opening.shared('postgresql://u:pw@h/db').redact_url('postgresql://u:pw@h/db'))\n"
        "assert not [m for m in sys.modules if m.startswith('psycopg')]\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["PostgreSQL support is not installed: pip install 'engram-memory[postgres]'",
                                        "postgresql://u:***@h/db"]
