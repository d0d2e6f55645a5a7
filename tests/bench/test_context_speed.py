"""bench/context_speed.py on a tiny model: both ratios come out, from numbers that agree."""

from __future__ import annotations

import gzip
import json

from cisrank.testing import SAMPLE_SENTENCES


def test_context_speed_runs_on_a_tiny_model(tiny_gpt2_dir, tmp_path, bench_script):
    data = tmp_path / "nq.jsonl.gz"
    with gzip.open(data, "wt", encoding="utf-8") as fh:
        for i, text in enumerate(SAMPLE_SENTENCES[:4]):
            ctx = {"title": f"T{i}", "text": text, "isgold": True}
            fh.write(json.dumps({"question": "who wrote hamlet ?", "ctxs": [ctx]}) + "\n")
    out = bench_script("context_speed").main(
        ["--data", str(data), "--model", str(tiny_gpt2_dir), "--k", "3", "--repeats", "1",
         "--new-tokens", "2", "--results-dir", str(tmp_path), "--name", "speed"]
    )  # fmt: skip
    assert out["curvature"]["k"] == 3 and out["curvature"]["max_abs_diff_engine_vs_plain"] < 1e-3
    assert out["curvature"]["engine_vs_plain_ratio"] > 0
    assert set(out["decoding"]["modes"]) == {"naive", "avg_ens", "replug", "leens", "clehe"}
    shared = out["decoding"]["shared_prefill"]
    assert shared["modes"] == "avg_ens+replug+leens+clehe" and shared["seconds"] > 0
    assert json.loads((tmp_path / "speed.json").read_text())["results"] == out
