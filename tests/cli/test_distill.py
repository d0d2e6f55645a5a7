"""`cisrank distill generate | train | run` end to end on tiny models: a CIS teacher (tiny GPT-2)
and a BERT student (tiny BERT), through the real command line."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from cisrank.cli import app
from cisrank.distill import rows as R
from cisrank.distill.pipeline import SUMMARY_FILE

runner = CliRunner()


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    return result


def test_generate_command_writes_rows_and_resumes(data_sets, tiny_gpt2_dir, tmp_path):
    out = tmp_path / "rows"
    args = [
        "distill", "generate", "--dataset", "trec-dl22", "--data-dir", str(data_sets / "trec-dl22"),
        "--teacher", "cis", "--model", str(tiny_gpt2_dir), "--template", "qa",
        "--estimator", "forward", "--depth", "3", "--shard-pairs", "9", "--out", str(out),
        "--quiet",
    ]  # fmt: skip
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    assert "4 queries, 12 pairs in 2 shards (2 written, 0 reused)" in first.output
    again = invoke(*args)
    assert again.exit_code == 0 and "(0 written, 2 reused)" in again.output
    rows = R.read_rows(out).to_pydict()
    assert set(rows["rank"]) == {1, 2, 3} and None not in rows["log_prior"]

    bad = invoke(*args[:-3], "--template", "qa", "--out", str(tmp_path / "x"), "--teacher", "dense")
    assert bad.exit_code != 0


def test_generate_command_takes_the_reverse_estimator(data_sets, tiny_gpt2_dir, tmp_path):
    """`--estimator reverse` reaches the teacher: its rows are log p(Q|K) under the chosen
    passage-first template, equal to the reverse reranker's scores, and carry no prior terms."""
    from cisrank.data.datasets import load_named
    from cisrank.rerank.cis import CISReranker

    out = tmp_path / "rows"
    res = invoke(
        "distill", "generate", "--dataset", "trec-dl22", "--data-dir", str(data_sets / "trec-dl22"),
        "--teacher", "cis", "--model", str(tiny_gpt2_dir), "--estimator", "reverse",
        "--reverse-template", "upr", "--depth", "3", "--out", str(out), "--quiet",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = R.read_rows(out).to_pydict()
    assert set(rows["log_prior"]) == {None} and set(rows["log_conditional"]) == {None}
    ds = load_named("trec-dl22", data_sets / "trec-dl22", require_qrels=False)
    direct = CISReranker(model=str(tiny_gpt2_dir), estimator="reverse", reverse_template="upr")
    got = dict(zip(zip(rows["qid"], rows["docid"], strict=True), rows["score"], strict=True))
    for qid in ds.qids:
        hits = ds.candidates[qid][:3]
        want = direct.score(ds.topics[qid], [h.text for h in hits])
        assert [got[(qid, h.docid)] for h in hits] == pytest.approx(want, abs=1e-4)
    forward = invoke(
        "distill", "generate", "--dataset", "trec-dl22", "--data-dir", str(data_sets / "trec-dl22"),
        "--teacher", "cis", "--model", str(tiny_gpt2_dir), "--estimator", "forward",
        "--depth", "3", "--out", str(tmp_path / "fwd"), "--quiet",
    )  # fmt: skip
    assert forward.exit_code == 0, forward.output
    assert R.read_rows(tmp_path / "fwd").to_pydict()["score"] != rows["score"]


def test_generate_command_rejects_bad_input(data_sets, tmp_path):
    res = invoke("distill", "generate", "--out", str(tmp_path / "o"), "--teacher", "scores",
                 "--dataset", "trec-dl22", "--data-dir", str(data_sets / "trec-dl22"))  # fmt: skip
    assert res.exit_code != 0
    assert "needs --scores-file" in str(res.exception) + res.output


@pytest.mark.slow
def test_run_chains_teacher_student_and_evaluation(
    data_sets, tiny_gpt2_dir, tiny_bert_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("CISRANK_DATA_DIR", str(data_sets))
    out = tmp_path / "run"
    args = [
        "distill", "run", "--out", str(out), "--teacher", "cis", "--model", str(tiny_gpt2_dir),
        "--base-model", str(tiny_bert_dir), "--epochs", "2", "--lr", "1e-3",
        "--train-batch-size", "4", "--max-length", "64", "--quiet",
    ]  # fmt: skip
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["eval_dataset"] == "trec-dl19"
    assert summary["spearman_to_teacher"]["queries"] == 3
    assert 0.0 <= summary["nDCG@10"]["student"] <= 1.0
    for stage in ("teacher/trec-dl22", "teacher/trec-dl21", "teacher/trec-dl19-eval", "student"):
        assert (out / stage).is_dir(), stage
    assert (out / "eval" / "run.trec").is_file()
    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    assert metrics["runs"]["reranked"]["nDCG@10"] == summary["nDCG@10"]["student"]
    # Everything is done: a rerun only re-evaluates.
    again = invoke(*args)
    assert again.exit_code == 0
    assert json.loads((out / SUMMARY_FILE).read_text())["nDCG@10"] == summary["nDCG@10"]


def test_training_flags_left_out_are_the_config_defaults():
    from cisrank.cli.distill import _config
    from cisrank.distill.config import TrainConfig

    unset = dict.fromkeys(
        ["base_model", "epochs", "lr", "train_batch_size", "max_length", "label_norm", "loss",
         "dev_dataset", "dev_depth", "eval_steps", "seed"]
    )  # fmt: skip
    assert _config({**unset, "batch_size": 64}) == TrainConfig()  # --batch-size is the teacher's
    cfg = _config({**unset, "lr": 1e-3, "train_batch_size": 8, "dev_dataset": "none"})
    assert cfg == TrainConfig(learning_rate=1e-3, batch_size=8, dev_dataset=None)
    res = invoke("distill", "train", "--help")
    assert res.exit_code == 0
    assert f"(default {TrainConfig.model_fields['learning_rate'].default})" in res.output


def _flags(verb: str) -> list[str]:
    import typer.main

    group: Any = typer.main.get_command(app)
    return [p.opts[0] for p in group.commands["distill"].commands[verb].params]


STUDENT_FLAGS = [
    "--base-model", "--student", "--bf16", "--epochs", "--lr", "--train-batch-size", "--max-length", "--label-norm",
    "--loss", "--dev-dataset", "--dev-depth", "--eval-steps", "--seed",
]  # fmt: skip
"""The student's flags of `distill train` and `distill run`, in the order they always had (the
student's kind and bf16 training added after its base model)."""


def test_training_flags_are_the_marked_config_fields_in_the_order_they_had():
    from cisrank.config import flag_fields, flag_name
    from cisrank.distill.config import TrainConfig

    teacher_sets = ["--teacher-fuse", "--teacher-fusion", "--list-depth", "--temperature"]
    assert _flags("train") == [
        "--out", "--data", "--teacher-set", "--pool", *teacher_sets, *STUDENT_FLAGS,
        "--resume", "--keep-checkpoints", "--device",
    ]  # fmt: skip
    run = _flags("run")
    assert run[run.index("--depth") + 1 : run.index("--device")] == STUDENT_FLAGS
    # generated: each `Flag()` field of TrainConfig is one, named as TrainConfig.flags says
    marked = [flag_name(TrainConfig.flags.get(f, f)) for f in flag_fields(TrainConfig)]
    assert marked == teacher_sets + STUDENT_FLAGS
    res = invoke("distill", "train", "--out", "x", "--data", "y", "--list-depth", "1")
    assert res.exit_code == 2  # a usage error naming the flag, as it always was
    assert "Invalid value for '--list-depth': Input should be greater than or equal to 2" in (
        res.output
    )


def test_the_teacher_set_flags_reach_the_training_config():
    from cisrank.cli.distill import _config
    from cisrank.distill.config import TrainConfig

    given = {"teacher_fuse": "cis:1,dense:0.5", "teacher_fusion": "minmax", "list_depth": 4}
    cfg = _config({**given, "temperature": 0.5, "label_norm": "none", "loss": "listwise"})
    want = TrainConfig(**given, temperature=0.5, normalize="none", loss="listwise")
    assert cfg == want
