"""End to end on a made-up dataset: every output file, run invariants, depth handling."""

import itertools
import json
import subprocess
import sys

import pytest
from builders import hit, write_folder

from cisrank.data.datasets import load_folder
from cisrank.data.runs import Run
from cisrank.eval.pipeline import first_stage_run, run_eval
from cisrank.rerank.base import BaseReranker, IdentityReranker


class LengthReranker(BaseReranker):
    """Scores by passage length: a transparent reranker to predict the reranked order."""

    name = "length"
    model_name = "len"

    def score_batch(self, requests):
        return [[float(len(p)) for p in passages] for _, passages in requests]


@pytest.fixture
def folder(tmp_path):
    hits = [
        hit("a", 1, 3.0, "x"),
        hit("b", 2, 2.0, "xxx"),
        hit("c", 3, 1.0, "xx"),
        hit("d", 4, 0.5, "xxxx"),
    ]
    return write_folder(
        tmp_path / "mini",
        {("q1", "query one"): hits, ("q2", "query two"): [hit("a", 1, 1.0, "x")]},
        qrels="q1 Q0 b 3\nq1 Q0 d 2\nq2 Q0 a 1\nq3 Q0 z 2\n",
        topics="q1\tquery one\nq2\tquery two\nq3\tno candidates\n",
    )


def test_outputs_and_run_invariants(folder, tmp_path):
    out = tmp_path / "out"
    result = run_eval(load_folder(folder), LengthReranker(), output=out, progress=False)
    assert result.runs["reranked"].rankings["q1"][0][0] == "d"
    assert [d for d, _ in result.runs["reranked"].rankings["q1"]] == ["d", "b", "c", "a"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dataset"] == "mini"
    assert set(metrics["runs"]) == {"first-stage", "reranked"}
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
    result = run_eval(load_folder(folder), LengthReranker(), depth=2, progress=False)
    # Head a, b reranked by length (b first); c, d keep first-stage order below.
    assert [d for d, _ in result.runs["reranked"].rankings["q1"]] == ["b", "a", "c", "d"]


def test_no_reranker_only_first_stage(folder, tmp_path):
    result = run_eval(
        load_folder(folder), IdentityReranker(), output=tmp_path / "o", progress=False
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
    run_eval(dataset, IdentityReranker(), output=tmp_path / "o", progress=False)
    first_stage_run(dataset).write_trec(tmp_path / "want.trec", tag="cisrank-first-stage")
    assert (tmp_path / "o" / "run.trec").read_text() == (tmp_path / "want.trec").read_text()
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert metrics["reranker"] is None and "timing" not in metrics and "significance" not in metrics


def cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "cisrank.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_cli_eval_run_on_folder(folder, tmp_path):
    p = cli("eval", "run", "--data-dir", str(folder), "--output", str(tmp_path / "o"), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["runs"]["first-stage"]["nDCG@1"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["eval", "run", "--data-dir", "/no/such/dir"],
            "error: data folder '/no/such/dir' does not exist",
        ),
        (["eval", "trec-dl19", "--reranker", "bogus"], "error: unknown reranker 'bogus'"),
        (["eval", "run"], "error: give --data-dir DIR"),
        (
            ["rerank", "--query", "q", "--passages", "/no/file"],
            "error: passages file '/no/file' does not exist",
        ),
    ],
)
def test_cli_errors_are_one_line(args, message):
    p = cli(*args)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].startswith(message)
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize(
    "verb",
    [
        [],
        ["eval"],
        ["eval", "trec-dl19"],
        ["eval", "trec-dl21"],
        ["eval", "run"],
        ["rerank"],
        ["version"],
    ],
)
def test_cli_help(verb):
    p = cli(*verb, "--help")
    assert p.returncode == 0 and "Usage" in p.stdout
    doc = p.stdout.lower()
    assert any(word in doc for word in ("evaluate", "rank", "version", "retrieval"))


def test_cli_rerank_dense(tiny_bert_dir, tmp_path):
    passages = tmp_path / "p.jsonl"
    passages.write_text(
        '{"id": "x", "text": "Paris is the capital of France."}\n{"text": "Hamlet is a tragedy."}\n'
    )
    p = cli(
        "rerank",
        "--reranker",
        "dense",
        "--model",
        str(tiny_bert_dir),
        "--query",
        "capital of France",
        "--passages",
        str(passages),
        "--json",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert {r["id"] for r in out["results"]} == {"x", "1"}
    assert out["results"][0]["score"] >= out["results"][1]["score"]
