"""The experiments are bench/Makefile's (`make -C bench rag`): run from the repository root with
the main Makefile's venv, data folder and variables, and the main Makefile says where they went
instead of running anything (`make -n` only: nothing is executed)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATA_DIR", "CISRANK_DATA_DIR")}
    env.pop("MAKEFLAGS", None)
    return subprocess.run(
        ["make", "--no-print-directory", "-n", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


@pytest.mark.parametrize("target", ["rag", "rag-select", "rag-heldout", "which-reranker"])
def test_the_main_makefile_points_to_bench_and_runs_nothing(target):
    res = _make(target)
    assert res.returncode != 0
    assert f"moved to bench/Makefile: run make -C bench {target}" in res.stderr
    assert res.stdout == ""


def test_bench_rag_runs_from_the_root_with_the_same_variables():
    res = _make("-C", "bench", "rag", "RAG_OUT=out/x")
    assert res.returncode == 0, res.stderr
    runs = [line for line in res.stdout.splitlines() if "cisrank eval rag" in line]
    assert len(runs) == 6
    questions = Path(os.path.abspath(ROOT / ".." / "shared" / "data"))
    for line in runs:
        assert line.startswith(f"cd {ROOT} && .venv/bin/cisrank eval rag "), line
        assert f"--questions {questions}/nq-open-lim/nq-open-oracle.first2000.jsonl.gz" in line
        assert "--cache out/x/cache --resume" in line
    assert "--output out/x/related-k20" in res.stdout
    assert "--rerankers bench/rag_rerankers.json" in res.stdout


def test_bench_which_reranker_runs_the_script_from_the_root():
    res = _make("-C", "bench", "which-reranker")
    assert res.returncode == 0, res.stderr
    assert f"cd {ROOT} && .venv/bin/python bench/which_reranker.py" in res.stdout
