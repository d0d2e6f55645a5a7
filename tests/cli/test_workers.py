"""`--workers N`: eval and distill generate on N processes give the scores of one process."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from builders import write_set
from typer.testing import CliRunner

from cisrank.cli import app

runner = CliRunner()


@pytest.fixture
def sets(tmp_path):
    root = tmp_path / "data"
    write_set(root, "trec-dl21", ["105", "106", "101"], depth=5)
    write_set(root, "trec-dl22", ["101", "102", "103", "104"], depth=5, judged=False)
    return root


def _run_scores(folder: Path) -> dict[tuple[str, str], float]:
    out = {}
    for line in (folder / "run.trec").read_text().splitlines():
        qid, _, docid, _, score, _ = line.split()
        out[(qid, docid)] = float(score)
    return out


def test_eval_on_two_workers_scores_as_one(sets, tiny_gpt2_dir, tmp_path):
    base = ["eval", "run", "--data-dir", str(sets / "trec-dl21"), "--reranker", "cis"]
    base += ["--model", str(tiny_gpt2_dir), "--estimator", "reverse", "--quiet"]
    one = runner.invoke(app, [*base, "--workers", "1", "--output", str(tmp_path / "one")])
    two = runner.invoke(app, [*base, "--workers", "2", "--output", str(tmp_path / "two")])
    assert one.exit_code == 0 and two.exit_code == 0, one.output + two.output
    a, b = _run_scores(tmp_path / "one"), _run_scores(tmp_path / "two")
    assert a.keys() == b.keys() and all(abs(a[k] - b[k]) <= 1e-5 for k in a)
    metrics = [json.loads((tmp_path / x / "metrics.json").read_text()) for x in ("one", "two")]
    assert metrics[0]["runs"] == metrics[1]["runs"]
    bad = runner.invoke(app, [*base, "--workers", "0"])
    assert bad.exit_code == 2 and "--workers" in bad.output


def test_generate_on_two_workers_writes_the_rows_of_one(sets, tiny_gpt2_dir, tmp_path):
    base = ["distill", "generate", "--dataset", "trec-dl22", "--data-dir", str(sets / "trec-dl22")]
    base += ["--model", str(tiny_gpt2_dir), "--template", "qa", "--depth", "4", "-q"]
    base += ["--shard-pairs", "4"]
    one = runner.invoke(app, [*base, "--workers", "1", "--out", str(tmp_path / "one")])
    two = runner.invoke(app, [*base, "--workers", "2", "--out", str(tmp_path / "two")])
    assert one.exit_code == 0 and two.exit_code == 0, one.output + two.output
    for shard in sorted((tmp_path / "one").glob("shard-*.parquet")):
        assert pq.read_table(shard).equals(pq.read_table(tmp_path / "two" / shard.name))


def test_small_rerank_and_eval_run_in_process_unless_workers_are_given(
    sets, tiny_bert_dir, tmp_path, monkeypatch
):
    """Three passages, or an evaluation of three queries x five: a worker would cost more to
    start than it saves, so none starts; `--workers 2` is obeyed all the same."""
    from builders import InProcessPool

    from cisrank.jobs import pool

    built = InProcessPool.installed(monkeypatch)
    monkeypatch.setattr(pool, "cores", lambda: 2)  # a worker per core would be 2 here
    passages = tmp_path / "p.txt"
    passages.write_text("Hamlet is a tragedy.\nParis is the capital of France.\nfleas\n")
    rerank = ["rerank", "--reranker", "dense", "--model", str(tiny_bert_dir), "--json"]
    rerank += ["--query", "who wrote hamlet", "--passages", str(passages)]
    default = runner.invoke(app, rerank)
    assert default.exit_code == 0, default.output
    assert built == []
    evaluate = ["eval", "run", "--data-dir", str(sets / "trec-dl21"), "--reranker", "dense"]
    evaluate += ["--model", str(tiny_bert_dir), "--quiet", "--output", str(tmp_path / "e")]
    assert runner.invoke(app, evaluate).exit_code == 0 and built == []
    given = runner.invoke(app, [*rerank, "--workers", "2"])
    assert given.exit_code == 0, given.output
    assert len(built) == 1 and built[0].processes == 1
    ranked = [json.loads(r.stdout)["results"] for r in (default, given)]
    assert [r["index"] for r in ranked[0]] == [r["index"] for r in ranked[1]]
    assert all(abs(a["score"] - b["score"]) <= 1e-6 for a, b in zip(*ranked, strict=True))
