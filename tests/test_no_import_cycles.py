"""No module of `cisrank` imports itself back through others, counting every import statement.

import-linter (`make lint`) checks the floors between packages, but not circles between modules
of one package, and Python hides a circle closed by an import inside a function until that
function runs (`api/assembly.py` <-> `api/service.py` was found that way). This test reads
every module's source with `ast` and takes every import at any depth: inside functions, under
`if TYPE_CHECKING:`, in `try` blocks. `from a import b` counts as importing module `a.b` where
`a/b.py` exists, else `a`; relative imports are resolved; and importing `a.b.c` counts as
importing the packages `a` and `a.b` too, since their `__init__` runs first (except a module's own
packages, which are imported before it runs: only an explicit import of one of them counts).
"""

from __future__ import annotations

import ast
from pathlib import Path

import cisrank

Edge = tuple[str, str, int]  # (imported module, file, line)


def module_files(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> source file, for every module under `package_dir`."""
    root = package_dir.parent
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """`name`, or the longest of its prefixes that is a module here (`a.b.func` -> `a.b`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[Edge]:
    """Every module of `modules` that module `name` imports, at any depth of its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    named: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            named += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                named.append((sub if sub in modules else source, node.lineno))
    edges: list[Edge] = []
    for target, line in named:
        found = _known(target, modules)
        if found is None or found == name:
            continue
        edges.append((found, str(path), line))
        parent = found.rpartition(".")[0]
        while parent:  # the packages whose __init__ runs before it, but not this module's own
            if not name.startswith(parent + "."):
                edges.append((parent, str(path), line))
            parent = parent.rpartition(".")[0]
    return edges


def import_graph(package_dir: Path) -> dict[str, list[Edge]]:
    modules = module_files(package_dir)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted({e[0] for e in graph[start]})))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted({e[0] for e in graph[child]}))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(component: list[str], graph: dict[str, list[Edge]]) -> str:
    """The imports that keep `component` in a circle, one per line with file and line."""
    members = set(component)
    lines = [f"circle of {len(component)} modules: {', '.join(component)}"]
    for name in component:
        for target, path, line in sorted(set(graph[name])):
            if target in members:
                lines.append(f"  {name} -> {target}  ({path}:{line})")
    return "\n".join(lines)


def test_no_module_imports_itself_back():
    graph = import_graph(Path(cisrank.__file__).parent)
    assert len(graph) > 100 and sum(map(len, graph.values())) > 400  # the whole package was read
    found = circles(graph)
    assert not found, "\n".join(describe(c, graph) for c in found)


def test_a_circle_closed_inside_a_function_is_found(tmp_path):
    """The checker itself: a lazy import (in a function, relative), a TYPE_CHECKING import and
    an import that runs a package's `__init__` each close a circle; the last package has none."""
    files = {
        "lazy/__init__.py": "",
        "lazy/a.py": "from lazy.b import f\n",
        "lazy/b.py": "def f():\n    from . import a\n    return a\n",
        "typed/__init__.py": "",
        "typed/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import typed.b\n",
        "typed/b.py": "import typed.a\n",
        "init/__init__.py": "",
        "init/p.py": "import init.r.t\n",  # runs init/r/__init__.py, which imports p
        "init/r/__init__.py": "from init.p import P\n",
        "init/r/t.py": "T = 1\n",
        "clean/__init__.py": "",
        "clean/a.py": "import clean.b\n",
        "clean/b.py": "import os\n",
    }
    for name, text in files.items():
        (tmp_path / "pkgs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkgs" / name).write_text(text)
    found = {}
    for package in ("lazy", "typed", "init", "clean"):
        found[package] = circles(import_graph(tmp_path / "pkgs" / package))
    assert found["lazy"] == [["lazy.a", "lazy.b"]]
    assert found["typed"] == [["typed.a", "typed.b"]]
    assert found["init"] == [["init.p", "init.r"]]
    assert found["clean"] == []
