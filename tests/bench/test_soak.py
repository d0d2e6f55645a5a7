"""bench/soak.py, shortened: a real `cisrank serve` (tiny BERT reranker, a BM25 index of the DL19
candidates) under mixed rerank and search traffic for 3 s, with 0 errors and the figures recorded."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.slow
def test_a_3_second_soak_has_no_errors_and_records_its_figures(tmp_path, dl19_dir, tiny_bert_dir):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, str(BENCH / "soak.py"), "--seconds", "3", "--concurrency", "8"]
    cmd += ["--model", str(tiny_bert_dir), "--data-dir", str(dl19_dir)]
    cmd += ["--passages", "10", "--results-dir", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((tmp_path / "soak.json").read_text())
    assert record["benchmark"] == "soak"
    res = record["results"]
    assert res["errors"] == 0 and res["error_kinds"] == {}
    assert res["concurrency"] == 8 and res["seconds"] >= 3
    assert res["server_exit_code"] == 0  # SIGTERM after the soak: a clean stop
    assert set(res["by_kind"]) == {"rerank", "search", "search+rerank"}
    assert all(k["requests"] > 0 for k in res["by_kind"].values())
    assert res["requests"] == sum(k["requests"] for k in res["by_kind"].values())
    assert 0 < res["p50_ms"] <= res["p99_ms"]
    assert res["peak_rss_mb"] >= res["rss_before_mb"] > 0
    assert "0 errors" in proc.stdout
