"""Only `cisrank/api/` speaks HTTP: no module outside it imports FastAPI or Starlette, at any
depth of its source, and the import-linter contract that says so names every package and leaf of
`cisrank` but `api` (a new package must be added to it, or it goes unchecked)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import cisrank

PACKAGE = Path(cisrank.__file__).parent
WEB = ("fastapi", "starlette")


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
    return names


def test_no_module_outside_the_api_imports_the_web_framework():
    offenders = {
        str(path.relative_to(PACKAGE.parent)): sorted(web)
        for path in sorted(PACKAGE.rglob("*.py"))
        if "api" not in path.relative_to(PACKAGE).parts[:1]
        and (web := {n for n in _imported(path) if n.split(".")[0] in WEB})
    }
    assert offenders == {}


def test_the_contract_names_every_package_but_the_api():
    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["name"] == "only the API imports the web framework"]
    assert sorted(contract["forbidden_modules"]) == sorted(WEB)
    top = {
        f"cisrank.{p.stem if p.is_file() else p.name}"
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    assert set(contract["source_modules"]) == top - {"cisrank.api"}
