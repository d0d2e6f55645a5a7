"""Student training: labels, batching, and a tiny end-to-end run that must actually learn."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from cisrank.data.datasets import load_folder
from cisrank.distill import rows as R
from cisrank.distill.config import TrainConfig
from cisrank.distill.evaluate import spearman_to_teacher
from cisrank.distill.losses import load_loss, normalized_labels
from cisrank.distill.losses.sampling import length_grouped_batches
from cisrank.distill.train import CURVE_FILE, TRAINING_FILE, train
from cisrank.errors import DataError


def test_per_query_standardization_matches_numpy():
    scores = [-3.0, 1.5, 0.25, 7.0]
    a = np.array(scores)
    assert normalized_labels(scores, "query") == pytest.approx(((a - a.mean()) / a.std()).tolist())
    assert normalized_labels(scores, "none") == scores
    assert normalized_labels([2.0, 2.0], "query") == [0.0, 0.0]
    with pytest.raises(DataError, match="NaN"):
        normalized_labels([1.0, float("nan")], "none")


def test_margin_examples_are_teacher_differences_within_one_query():
    queries = [
        {"query": "a", "passages": ["p1", "p2", "p3"], "scores": [3.0, 1.0, 2.0]},
        {"query": "b", "passages": ["x", "y"], "scores": [0.0, 5.0]},
    ]
    margin = TrainConfig(loss="margin-mse", normalize="none", margin_pairs=2, seed=1)
    ex = load_loss("margin-mse").examples(queries, margin)
    score = {("a", "p1"): 3.0, ("a", "p2"): 1.0, ("a", "p3"): 2.0, ("b", "x"): 0.0, ("b", "y"): 5.0}
    assert len(ex) == 10
    for q, pos, neg, label in zip(*ex.columns.values(), strict=True):
        assert pos != neg and label == score[(q, pos)] - score[(q, neg)]
    mse = load_loss("mse").examples(queries, TrainConfig(normalize="query", seed=1))
    assert mse.columns["passage"] == ["p1", "p2", "p3", "x", "y"]
    assert mse.columns["label"][3:] == [-1.0, 1.0]


def test_length_grouped_batches_cover_everything_with_less_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(10, 500, size=1000).tolist()
    batches = length_grouped_batches(lengths, 16, seed=3)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(1000))
    assert batches == length_grouped_batches(lengths, 16, seed=3)
    assert batches != length_grouped_batches(lengths, 16, seed=4)

    def padded(bs):
        return sum(max(lengths[i] for i in b) * len(b) for b in bs)

    order = rng.permutation(1000).tolist()
    random_batches = [order[k : k + 16] for k in range(0, 1000, 16)]
    assert padded(batches) < 0.75 * padded(random_batches)


def test_spearman_to_teacher_is_the_mean_of_per_query_correlations():
    student = {"q1": {"a": 1.0, "b": 2.0, "c": 3.0}, "q2": {"a": 1.0, "b": 0.0, "c": 0.5}}
    teacher = {"q1": {"a": 10.0, "b": 30.0, "c": 20.0}, "q2": {"a": 2.0, "b": 1.0, "c": 3.0}}
    want = np.mean(
        [spearmanr([1, 2, 3], [10, 30, 20]).statistic, spearmanr([1, 0, 0.5], [2, 1, 3]).statistic]
    )
    got = spearman_to_teacher(student, teacher)
    assert got["spearman"] == pytest.approx(want) and got["queries"] == 2
    flat = {"q1": student["q1"], "q3": {"a": 1.0, "b": 1.0}}
    got = spearman_to_teacher(flat, {**teacher, "q3": {"a": 1.0, "b": 2.0}})
    assert got["undefined"] == 1 and got["queries"] == 1


def test_training_learns_the_teacher_and_saves_a_loadable_student(
    rows_dir, data_sets, tiny_bert_dir, tmp_path
):
    from sentence_transformers.cross_encoder import CrossEncoder

    dev = load_folder(data_sets / "trec-dl21")
    cfg = TrainConfig(
        base_model=str(tiny_bert_dir),
        epochs=30,  # a random tiny BERT needs ~60 steps before its outputs start to differ
        learning_rate=1e-3,
        batch_size=4,
        max_length=64,
        warmup_ratio=0.0,
        logging_steps=10,
        eval_steps=50,
    )
    out = tmp_path / "student"
    record = train([rows_dir], out, cfg, dev)
    losses = [h["loss"] for h in record["history"] if "loss" in h]
    assert len(losses) == 15 and losses[-1] < 0.3 * losses[0]
    key = "eval_trec_dl21_ndcg@10"
    dev_scores = [h[key] for h in record["history"] if key in h]
    assert len(dev_scores) == 3 and record["best_dev_metric"] == max(dev_scores)
    assert not (out / "checkpoints").exists()
    curve = (out / CURVE_FILE).read_text().splitlines()
    assert curve[0].split("\t")[:3] == ["step", "epoch", "loss"] and len(curve) > 5
    assert json.loads((out / TRAINING_FILE).read_text())["examples"] == 20

    # The saved student loads with plain sentence-transformers and fits the training rows.
    student = CrossEncoder(str(out))
    table = R.read_rows(rows_dir).to_pydict()
    pred = student.predict(list(zip(table["query"], table["passage"], strict=True)))
    student_scores: dict = {}
    teacher_scores: dict = {}
    for i, (qid, value) in enumerate(zip(table["qid"], pred, strict=True)):
        student_scores.setdefault(qid, {})[i] = float(value)
        teacher_scores.setdefault(qid, {})[i] = table["score"][i]
    rho = spearman_to_teacher(student_scores, teacher_scores)
    assert rho["spearman"] > 0.8

    with pytest.raises(DataError, match="already holds a trained model"):
        train([rows_dir], out, cfg, dev)


def test_training_is_reproducible_whatever_the_random_state_before_it(
    rows_dir, tiny_bert_dir, tmp_path
):
    """The same config gives the same student bit for bit, even after other code drew random
    numbers (the classification head is made at random: seeded before it is made). `make
    student` relies on this to rebuild the kept student from a clean clone."""
    from safetensors.torch import load_file

    cfg = TrainConfig(
        base_model=str(tiny_bert_dir), epochs=2, batch_size=4, max_length=64, logging_steps=5
    )
    weights = []
    for k in range(2):
        torch.manual_seed(1000 + k)  # another state each time, as other code would leave it
        train([rows_dir], tmp_path / f"s{k}", cfg)
        weights.append(load_file(str(tmp_path / f"s{k}" / "model.safetensors")))
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    other = TrainConfig(**{**cfg.model_dump(), "seed": cfg.seed + 1})
    train([rows_dir], tmp_path / "other", other)
    head = load_file(str(tmp_path / "other" / "model.safetensors"))["classifier.weight"]
    assert not torch.equal(head, weights[0]["classifier.weight"])  # the seed does decide it


def test_kept_checkpoints_hold_the_best_and_the_last_and_the_student_is_the_best(
    rows_dir, data_sets, tiny_bert_dir, tmp_path, monkeypatch
):
    """`distill train --keep-checkpoints` leaves the checkpoints for averaging or comparing them
    (the run deletes them otherwise), and the student it saves is the best one's weights."""
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from cisrank.cli import app

    monkeypatch.setenv("CISRANK_DATA_DIR", str(data_sets))
    out = tmp_path / "student"
    args = [
        "distill", "train", "--data", str(rows_dir), "--out", str(out),
        "--base-model", str(tiny_bert_dir), "--epochs", "3", "--lr", "1e-3",
        "--train-batch-size", "4", "--max-length", "64", "--eval-steps", "2",
        "--keep-checkpoints",
    ]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    record = json.loads((out / TRAINING_FILE).read_text())
    kept = sorted((out / "checkpoints").glob("checkpoint-*"), key=lambda d: int(d.name[11:]))
    best = out / "checkpoints" / Path(record["best_checkpoint"]).name
    assert best in kept and kept[-1].name == "checkpoint-15"  # 20 examples / 4 x 3 epochs
    student = load_file(str(out / "model.safetensors"))
    chosen = load_file(str(best / "model.safetensors"))
    assert student.keys() == chosen.keys()
    assert all(torch.equal(student[k], chosen[k]) for k in student)


def test_training_refuses_an_unfinished_generate(rows_dir, tiny_bert_dir, tmp_path):
    (rows_dir / R.MANIFEST).unlink()
    with pytest.raises(DataError, match=r"has no manifest\.json"):
        train([rows_dir], tmp_path / "s", TrainConfig(base_model=str(tiny_bert_dir)))
    with pytest.raises(DataError, match="--loss must be"):
        train([rows_dir], tmp_path / "s", TrainConfig(loss="hinge"))


def test_train_config_defaults_are_the_documented_recipe():
    # README and bench/RESULTS.md: `--epochs 2 --lr 2e-4` (MiniLM student, per-query labels, MSE)
    cfg = TrainConfig()
    assert (cfg.base_model, cfg.epochs, cfg.learning_rate) == ("all-MiniLM-L6-v2", 2.0, 2e-4)
    assert (cfg.batch_size, cfg.max_length, cfg.normalize, cfg.loss) == (32, 256, "query", "mse")
    assert (cfg.dev_dataset, cfg.dev_depth, cfg.eval_steps, cfg.seed) == ("trec-dl21", 30, None, 12)
    assert cfg.replace(learning_rate=None, seed=3) == TrainConfig(seed=3)
    assert TrainConfig(dev_dataset="none").dev_dataset is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"learning_rate": -1.0}, r"--lr must be greater than 0, got -1\.0"),
        ({"batch_size": 0}, "--train-batch-size must be greater than or equal to 1"),
        ({"normalize": "rank"}, "--label-norm must be 'none' or 'query', got 'rank'"),
    ],
)
def test_bad_training_settings_name_the_flag_in_one_line(changes, message):
    with pytest.raises(DataError, match=message) as err:
        TrainConfig(**changes)
    assert "\n" not in str(err.value)
    with pytest.raises(DataError, match=message):
        TrainConfig().replace(**changes)
