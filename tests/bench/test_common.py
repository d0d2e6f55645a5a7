"""bench/common.write_result: the JSON record a benchmark leaves next to bench/RESULTS.md."""

import json
import os
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def common(bench_script):
    return bench_script("common")


def test_write_result_records_figures_machine_and_date(tmp_path, common):
    path = common.write_result("demo", {"p50_s": 0.25, "speedup": 3.5}, results_dir=tmp_path)
    assert path == tmp_path / "demo.json"
    record = json.loads(path.read_text())
    assert record["benchmark"] == "demo"
    assert record["results"] == {"p50_s": 0.25, "speedup": 3.5}
    assert record["machine"]["cores"] == os.cpu_count()
    assert record["machine"]["torch"] == torch.__version__
    assert record["machine"]["cpu_model"]
    assert record["date"].endswith("+00:00")
    assert os.listdir(tmp_path) == ["demo.json"]


def test_results_go_to_bench_results_by_default(common):
    assert common.RESULTS_DIR == BENCH / "results"


def test_report_prints_every_figure_aligned_and_writes_the_same_record(tmp_path, capsys, common):
    path = common.report("demo", {"pairs": 1000, "speedup_of_default": 1.119}, tmp_path)
    assert capsys.readouterr().out.splitlines() == [
        "             pairs: 1000",
        "speedup_of_default: 1.119",
    ]
    assert json.loads(path.read_text())["results"] == {"pairs": 1000, "speedup_of_default": 1.119}


def test_interleaved_scores_every_call_in_rotated_order_and_keeps_query_order(common):
    """Each reranker sees the same requests, `queries_per_call` at a time; who goes first
    rotates call by call; scores come back flattened in query order."""
    from types import SimpleNamespace

    calls = []

    class Fake:
        def __init__(self, name, offset):
            self.name, self.offset = name, offset

        def score_batch(self, requests):
            calls.append((self.name, [q for q, _ in requests]))
            return [[self.offset + len(q) + i for i in range(len(p))] for q, p in requests]

    hit = SimpleNamespace
    ds = SimpleNamespace(
        topics={"1": "a", "2": "bb", "3": "ccc"},
        candidates={q: [hit(text=f"p{i}") for i in range(4)] for q in ("1", "2", "3")},
    )
    threads = torch.get_num_threads()  # set before each call: left as it is
    rerankers = {"x": (Fake("x", 0), threads), "y": (Fake("y", 100), threads)}
    seconds, scores = common.interleaved(rerankers, ds, ["1", "2", "3"], 2, queries_per_call=2)
    assert calls == [("x", ["a", "bb"]), ("y", ["a", "bb"]), ("y", ["ccc"]), ("x", ["ccc"])]
    assert scores == {"x": [1, 2, 2, 3, 3, 4], "y": [101, 102, 102, 103, 103, 104]}
    assert set(seconds) == {"x", "y"} and all(v >= 0 for v in seconds.values())


def test_result_name_leaves_out_an_unset_tag(common):
    assert common.result_name("student_speed", "trec-dl19", "mpnet", "") == (
        "student_speed_trec-dl19_mpnet"
    )
    assert common.result_name("openvino_student", "trec-dl19", "avx512-s12") == (
        "openvino_student_trec-dl19_avx512-s12"
    )
