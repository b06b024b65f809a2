"""No import cycle anywhere in the installed tree (models, retrieval, store, server, eval, checks).

Every ``engram_memory.*`` import of every module is read with ``ast`` -- at the top, inside a
function or under ``TYPE_CHECKING`` alike: an import moved into a function still ties the two
modules together. ``from X import name`` is an edge to the module ``X.name`` when that is a
module, else to ``X``; a package's ``__init__`` that Python runs implicitly on the way to a
submodule is not an edge. A strongly connected component of more than one module is a cycle; each
one found is printed with the import lines that close it. What two modules both need belongs in
the lower one, or in a small module of its own -- not behind an import hidden in a function.
And every ``engram_memory.*`` import names a module the tree holds (a path a move left behind is
found here, even inside a function, where mypy's ignore_missing_imports hides it)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

NAMESPACE = "engram_memory"
PACKAGES = ("models", "retrieval", "store", "server", "eval", "checks")

Graph = dict[str, dict[str, str]]  # module -> {imported module: "path:line" of its first import}


def installed_folders() -> dict[str, Path]:
    """Each package's folder, as installed (``engram_memory.store`` -> its directory)."""
    folders = {}
    for package in PACKAGES:
        spec = importlib.util.find_spec(f"{NAMESPACE}.{package}")
        assert spec is not None and spec.submodule_search_locations, f"{NAMESPACE}.{package} is not installed"
        folders[f"{NAMESPACE}.{package}"] = Path(next(iter(spec.submodule_search_locations)))
    return folders


def modules_in(folders: dict[str, Path]) -> dict[str, Path]:
    """Dotted module name -> its file, for every ``.py`` under each package folder."""
    found = {}
    for package, folder in folders.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def import_graph(modules: dict[str, Path], namespace: str = NAMESPACE) -> Graph:
    def known(name: str) -> str | None:
        """The deepest module of ``name`` this tree holds (``a.b.C`` -> ``a.b`` when C is a class)."""
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: Graph = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: dict[str, str] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [known(a.name) for a in node.names if a.name.startswith(namespace + ".")]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # a relative import: from its own package upwards
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}" if base else anchor
                if base == namespace or base.startswith(namespace + "."):
                    targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else known(base)
                               for a in node.names]
            for target in targets:
                if target is not None and target != module:
                    edges.setdefault(target, f"{path.name}:{node.lineno}")
        graph[module] = edges
    return graph


def unresolved(modules: dict[str, Path], namespace: str = NAMESPACE) -> list[str]:
    """Absolute imports of a ``namespace`` module the tree does not hold (a path a move left behind:
    mypy, with ignore_missing_imports, does not see one inside a function), as ``file:line: module``."""
    found = []
    for path in modules.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found += [f"{path.name}:{node.lineno}: {name}" for name in names
                      if name.startswith(namespace + ".") and name not in modules]
    return found


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def describe(graph: Graph, component: list[str]) -> str:
    inside = set(component)
    lines = [f"cycle of {len(component)} modules: {', '.join(component)}"]
    lines += [f"  {m} -> {t}  ({where})" for m in component for t, where in sorted(graph[m].items()) if t in inside]
    return "\n".join(lines)


def test_no_import_cycle_in_the_installed_tree() -> None:
    graph = import_graph(modules_in(installed_folders()))
    found = cycles(graph)
    report = "\n".join(describe(graph, c) for c in found)
    print(report)
    assert found == [], "\n" + report


def test_the_graph_sees_the_tree() -> None:
    """Not vacuous on the real tree: every package is read and known edges are there, a top-level
    import and one inside a function alike."""
    graph = import_graph(modules_in(installed_folders()))
    assert {m.split(".")[1] for m in graph} == set(PACKAGES)
    assert "engram_memory.server.admin.app" in graph["engram_memory.server.cli"]  # top level
    assert "engram_memory.store.core.engine" in graph["engram_memory.server.console.command"]  # inside a function


def test_every_import_names_an_installed_module() -> None:
    missing = unresolved(modules_in(installed_folders()))
    assert missing == [], "\n".join(missing)


def test_a_cycle_is_found(tmp_path: Path) -> None:
    """Two modules importing each other (one of them inside a function, one through ``from package
    import module``) are a cycle; a module that only imports one of them is not part of it."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from demo.pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def late():\n    import demo.pkg.a\n")
    (package / "c.py").write_text("from demo.pkg.a import b\nfrom . import a\n")
    graph = import_graph(modules_in({"demo.pkg": package}), namespace="demo")
    assert graph["demo.pkg.c"] == {"demo.pkg.a": "c.py:1"}
    found = cycles(graph)
    assert found == [["demo.pkg.a", "demo.pkg.sub.b"]]
    assert "demo.pkg.sub.b -> demo.pkg.a  (b.py:2)" in describe(graph, found[0])
    assert unresolved(modules_in({"demo.pkg": package}), namespace="demo") == []
    (package / "d.py").write_text("def f():\n    from demo.pkg.gone import x\n    import demo.pkg.sub.gone\n")
    assert unresolved(modules_in({"demo.pkg": package}), namespace="demo") == [
        "d.py:2: demo.pkg.gone", "d.py:3: demo.pkg.sub.gone"]
