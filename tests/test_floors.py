"""The floors contract (`[tool.importlinter]` in pyproject.toml) holds, and it has teeth.

`make lint` runs `lint-imports`; this test proves the contract would catch the mistake it exists
for, by adding one upward import (a data type importing the evaluator) to a copy of the package.

A second floor: no Python file of the project cites a tracker's issue number, which tells a
reader of the code nothing (the records in bench/RESULTS.md and bench/archive may).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

needs_lint_imports = pytest.mark.skipif(
    not LINT_IMPORTS.exists(), reason="import-linter not installed"
)
# Built from pieces so that this file, which the scan reads too, does not match itself.
ISSUE_CITATION = re.compile(r"\b[Ii]ssue" + r"s? #?\d+")
SCANNED = ("cisrank", "tests", "bench", "tools")


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


@needs_lint_imports
def test_the_package_keeps_its_floors(tmp_path: Path) -> None:
    result = _lint(_copy_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "kept, 0 broken" in result.stdout


@needs_lint_imports
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


def issue_citations(roots: Iterable[Path], base: Path) -> list[str]:
    """`file:line: text` of every line that cites an issue number, in every `.py` file under
    `roots`, paths relative to `base`: the list a failure prints, so each hit can be rewritten."""
    hits = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            lines = path.read_text(encoding="utf-8").splitlines()
            for number, line in enumerate(lines, start=1):
                if ISSUE_CITATION.search(line):
                    hits.append(f"{path.relative_to(base)}:{number}: {line.strip()}")
    return hits


def test_no_python_file_cites_an_issue_number() -> None:
    roots = [ROOT / name for name in SCANNED]
    assert all(root.is_dir() for root in roots)
    assert Path(__file__).resolve() in {p.resolve() for p in (ROOT / "tests").rglob("*.py")}
    hits = issue_citations(roots, ROOT)
    assert not hits, "say the fact, not the issue number:\n" + "\n".join(hits)


def test_the_issue_scan_names_each_citation_by_file_and_line(tmp_path: Path) -> None:
    word, plural = "issue", "Issues"
    nested = tmp_path / "pkg" / "deeper"
    nested.mkdir(parents=True)
    (nested / "cites.py").write_text(
        f'"""Fixed in {word} 48, finding 2."""\n'
        "x = 1  # no citation here\n"
        f"# {plural} 15 and 32\n"
        f"# see {word} #7\n",
        encoding="utf-8",
    )
    (tmp_path / "pkg" / "clean.py").write_text(
        f"# the {word}'s figure, a {word}61 flag, tissue 5, {word}s in general\n",
        encoding="utf-8",
    )
    (tmp_path / "pkg" / "notes.md").write_text(f"{word} 99\n", encoding="utf-8")
    hits = issue_citations([tmp_path / "pkg"], tmp_path)
    assert hits == [
        f'pkg/deeper/cites.py:1: """Fixed in {word} 48, finding 2."""',
        f"pkg/deeper/cites.py:3: # {plural} 15 and 32",
        f"pkg/deeper/cites.py:4: # see {word} #7",
    ]
