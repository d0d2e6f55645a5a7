"""End to end on a made-up dataset: every output file, run invariants, depth handling."""

import itertools
import json

import pytest
from builders import hit, write_folder, write_mini

from cisrank.data.datasets import load_folder
from cisrank.data.runs import Run
from cisrank.eval.pipeline import first_stage_run, run_eval
from cisrank.rerank.base import BaseReranker, IdentityReranker


class LengthReranker(BaseReranker):
    """Scores by passage length: a transparent reranker to predict the reranked order."""

    name = "length"
    model_name = "len"
    runtime = "python"  # what it declares is what eval records
    compute_type = "int"

    def score_batch(self, requests):
        return [[float(len(p)) for p in passages] for _, passages in requests]


@pytest.fixture
def folder(tmp_path):
    return write_mini(tmp_path / "mini")


def test_outputs_and_run_invariants(folder, tmp_path):
    out = tmp_path / "out"
    # q3 is judged but has no candidates: counted 0, as asked (the default refuses)
    result = run_eval(
        load_folder(folder), LengthReranker(), output=out, progress=False, missing="zero"
    )
    assert result.runs["reranked"].rankings["q1"][0][0] == "d"
    assert [d for d, _ in result.runs["reranked"].rankings["q1"]] == ["d", "b", "c", "a"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dataset"] == "mini"
    assert set(metrics["runs"]) == {"first-stage", "reranked"}
    # the runtime and number format that scored, as the reranker declares them
    assert metrics["reranker"] == {
        "name": "length",
        "model": "len",
        "runtime": "python",
        "compute_type": "int",
    }
    # q1 reranked top-1 is d (grade 2, ideal 3): 2/3; q2: a (1/1); q3 missing: 0.
    assert metrics["runs"]["reranked"]["nDCG@1"] == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert metrics["runs"]["first-stage"]["nDCG@1"] == pytest.approx((0 + 1 + 0) / 3)
    run = Run.read_trec(out / "run.trec")
    for ranking in run.rankings.values():
        scores = [s for _, s in ranking]
        assert all(x > y for x, y in itertools.pairwise(scores))
    lines = (out / "run.trec").read_text().splitlines()
    assert (
        lines[0].split()[:4] == ["q1", "Q0", "d", "1"] and lines[0].split()[5] == "cisrank-length"
    )
    tsv = (out / "per_query.tsv").read_text().splitlines()
    assert tsv[0].startswith("run\tqid\tnDCG@1") and len(tsv) == 1 + 2 * 3
    png = next(out.glob("delta_*.png")).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_depth_reranks_only_the_head(folder):
    result = run_eval(
        load_folder(folder), LengthReranker(), depth=2, progress=False, missing="zero"
    )
    # Head a, b reranked by length (b first); c, d keep first-stage order below.
    assert [d for d, _ in result.runs["reranked"].rankings["q1"]] == ["b", "a", "c", "d"]


def test_no_reranker_only_first_stage(folder, tmp_path):
    result = run_eval(
        load_folder(folder),
        IdentityReranker(),
        output=tmp_path / "o",
        progress=False,
        missing="zero",
    )
    assert set(result.runs) == {"first-stage"} and result.significance is None
    assert (tmp_path / "o" / "run.trec").is_file()


class RecordingLengthReranker(LengthReranker):
    def __init__(self):
        self.calls = []

    def score_batch(self, requests):
        self.calls.append([q for q, _ in requests])
        return super().score_batch(requests)


def test_queries_go_to_score_batch_in_chunks_with_identical_results(tmp_path):
    hits = {
        (f"q{i}", f"query {i}"): [hit("a", 1, 2.0, "x" * i), hit("b", 2, 1.0, "xx")]
        for i in range(5)
    }
    qrels = "".join(f"q{i} Q0 a 1\n" for i in range(5))
    dataset = load_folder(write_folder(tmp_path / "five", hits, qrels=qrels, topics=None))
    runs = {}
    for per_call in (1, 2, 8):
        r = RecordingLengthReranker()
        result = run_eval(dataset, r, progress=False, queries_per_call=per_call)
        runs[per_call] = result.runs["reranked"].rankings
        queries = [f"query {i}" for i in range(5)]
        assert r.calls == [queries[k : k + per_call] for k in range(0, 5, per_call)]
    assert runs[1] == runs[2] == runs[8]
    assert [d for d, _ in runs[8]["q3"]] == ["a", "b"]  # "xxx" is longer than "xx"
    assert [d for d, _ in runs[8]["q1"]] == ["b", "a"]
    with pytest.raises(ValueError, match="queries_per_call"):
        run_eval(dataset, LengthReranker(), progress=False, queries_per_call=0)


def test_identity_reranker_gives_the_first_stage_run(folder, tmp_path):
    dataset = load_folder(folder)
    run_eval(dataset, IdentityReranker(), output=tmp_path / "o", progress=False, missing="zero")
    first_stage_run(dataset).write_trec(tmp_path / "want.trec", tag="cisrank-first-stage")
    assert (tmp_path / "o" / "run.trec").read_text() == (tmp_path / "want.trec").read_text()
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert metrics["reranker"] is None and "timing" not in metrics and "significance" not in metrics
