"""The floors contract (`[tool.importlinter]` in pyproject.toml) holds, and it has teeth.

`make lint` runs `lint-imports`; this test proves the contract would catch the mistake it exists
for, by adding one upward import (a data type importing the evaluator) to a copy of the package.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter not installed")


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(cwd / "pyproject.toml"), "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
        timeout=600,
    )


def _copy_tree(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "cisrank", tmp_path / "cisrank", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_package_keeps_its_floors(tmp_path: Path) -> None:
    result = _lint(_copy_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "upward"),
    [
        ("data/types.py", "import cisrank.eval.metrics"),  # a shared type reaching for eval
        ("rerank/base.py", "import cisrank.retrieval.base"),  # two engines of one floor
        ("retrieval/bm25.py", "import cisrank.indexes.build"),  # the old cycle
        ("lm/engine.py", "import cisrank.rerank.cis"),  # the LM floor reaching for a reranker
        ("lm/prompts.py", "import cisrank.context.templates"),  # ... or for context assembly
        ("context/assemble.py", "import cisrank.rerank.cis"),  # rerank and context: siblings
    ],
)
def test_an_upward_import_breaks_the_contract(tmp_path: Path, module: str, upward: str) -> None:
    root = _copy_tree(tmp_path)
    target = root / "cisrank" / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{upward}  # noqa\n", "utf-8")
    result = _lint(root)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout or "broken" in result.stdout
    assert upward.split()[-1] in result.stdout
