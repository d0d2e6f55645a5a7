"""The bi-encoder student: its losses against hand computations, and a tiny end-to-end run that
learns the teacher and is served by the dense reranker with the cosines it was trained on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cisrank.distill import rows as R
from cisrank.distill.config import TrainConfig
from cisrank.distill.evaluate import spearman_to_teacher
from cisrank.distill.losses import load_loss
from cisrank.distill.losses.bi import BI_SCALE, BiListNetLoss, PairMSELoss, scaled_cosine
from cisrank.distill.train import student_kind, train
from cisrank.rerank.registry import kind_of


class _Fixed(torch.nn.Module):
    """A stand-in sentence model: each tokenized column's embedding is given."""

    def __init__(self, rows: list[torch.Tensor]) -> None:
        super().__init__()
        self.rows = [r.clone().requires_grad_(True) for r in rows]

    def forward(self, features):
        return {"sentence_embedding": self.rows[features["column"]]}


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def test_scores_are_the_scaled_cosine():
    a, b = torch.tensor([[3.0, 4.0], [1.0, 0.0]]), torch.tensor([[4.0, 3.0], [-2.0, 0.0]])
    assert scaled_cosine(a, b).tolist() == pytest.approx([BI_SCALE * 24 / 25, -BI_SCALE])


def test_pair_mse_and_listnet_against_numpy():
    rng = np.random.default_rng(0)
    q, d0, d1, d2 = (rng.normal(size=(2, 5)) for _ in range(4))
    labels = np.array([[1.0, -0.5, 0.2], [0.0, 2.0, -1.0]])
    model = _Fixed([torch.tensor(x, dtype=torch.float32) for x in (q, d0, d1, d2)])
    feats = [{"column": i} for i in range(4)]

    got = PairMSELoss(model)(feats[:2], torch.tensor(labels[:, 0])).item()
    assert got == pytest.approx(np.mean((BI_SCALE * _cos(q, d0) - labels[:, 0]) ** 2), rel=1e-5)

    got = BiListNetLoss(model)(feats, torch.tensor(labels)).item()
    scores = BI_SCALE * np.stack([_cos(q, d) for d in (d0, d1, d2)], axis=1)
    target = np.exp(labels) / np.exp(labels).sum(1, keepdims=True)
    log_p = scores - np.log(np.exp(scores).sum(1, keepdims=True))
    assert got == pytest.approx(-(target * log_p).sum(1).mean(), rel=1e-5)


def test_listwise_lists_become_columns_of_one_length():
    queries = [
        {"query": "a", "passages": ["p1", "p2", "p3"], "scores": [3.0, 1.0, 2.0]},
        {"query": "b", "passages": ["x", "y", "z"], "scores": [0.0, 5.0, 1.0]},
    ]
    loss = load_loss("listwise")
    cfg = TrainConfig(loss="listwise", normalize="none")
    ex = loss.bi_examples(loss.examples(queries, cfg))
    assert list(ex.columns) == ["query", "doc_0", "doc_1", "doc_2", "labels"]
    assert ex.columns["doc_1"] == ["p2", "y"] and ex.columns["labels"][1] == [0.0, 5.0, 1.0]
    short = [*queries, {"query": "c", "passages": ["u", "v"], "scores": [1.0, 0.0]}]
    ex = loss.bi_examples(loss.examples(short, cfg))
    assert ex.columns["doc_2"] == ["p3", "z", ""]
    assert ex.columns["labels"][2][:2] == [1.0, 0.0] and np.isnan(ex.columns["labels"][2][2])


def test_a_short_list_padded_to_the_batch_width_trains_as_it_would_alone():
    """The padded slot of a shorter list is left out of its softmax: the batch's loss is the
    mean of each list's ListNet loss computed apart in numpy, over its own passages only."""
    rng = np.random.default_rng(1)
    q, d0, d1, d2 = (rng.normal(size=(2, 5)) for _ in range(4))
    labels = np.array([[1.0, -0.5, 0.2], [0.3, 2.0, np.nan]])  # the second list has 2
    model = _Fixed([torch.tensor(x, dtype=torch.float32) for x in (q, d0, d1, d2)])
    got = BiListNetLoss(model)([{"column": i} for i in range(4)], torch.tensor(labels)).item()

    def alone(row: int, docs: tuple) -> float:
        s = BI_SCALE * np.array([_cos(q[row], d[row]) for d in docs])
        y = labels[row, : len(docs)]
        t = np.exp(y) / np.exp(y).sum()
        return float(-(t * (s - np.log(np.exp(s).sum()))).sum())

    want = (alone(0, (d0, d1, d2)) + alone(1, (d0, d1))) / 2
    assert np.isfinite(got) and got == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize(("loss", "epochs", "batch"), [("margin-mse", 12, 4), ("listwise", 15, 1)])
def test_a_bi_encoder_student_learns_the_teacher_and_serves_as_dense(
    loss, epochs, batch, rows_dir, tiny_bert_dir, tmp_path
):
    from sentence_transformers import SentenceTransformer

    from cisrank.rerank.registry import load_reranker

    cfg = TrainConfig(
        base_model=str(tiny_bert_dir),
        student="bi",
        loss=loss,
        epochs=epochs,  # about 60 steps: a random tiny BERT embeds every text alike at first
        learning_rate=1e-2,
        batch_size=batch,
        max_length=64,
        warmup_ratio=0.0,
        logging_steps=10,
        dev_dataset=None,
    )
    out = tmp_path / "student"
    record = train([rows_dir], out, cfg)
    losses = [h["loss"] for h in record["history"] if "loss" in h]
    assert losses[-1] < losses[0]  # ListNet's floor is the target's entropy, not 0
    assert record["config"]["student"] == "bi"

    table = R.read_rows(rows_dir).to_pydict()
    student = SentenceTransformer(str(out))
    q = student.encode(table["query"], normalize_embeddings=True)
    p = student.encode(table["passage"], normalize_embeddings=True)
    cos = (q * p).sum(axis=1)
    student_scores: dict = {}
    teacher_scores: dict = {}
    for i, qid in enumerate(table["qid"]):
        student_scores.setdefault(qid, {})[i] = float(cos[i])
        teacher_scores.setdefault(qid, {})[i] = table["score"][i]
    assert spearman_to_teacher(student_scores, teacher_scores)["spearman"] > 0.8

    # served by the dense reranker: the cosines of plain sentence-transformers, pair by pair
    dense = load_reranker("dense", str(out))
    first = table["qid"][0]
    rows = [i for i, qid in enumerate(table["qid"]) if qid == first]
    served = dense.score(table["query"][rows[0]], [table["passage"][i] for i in rows])
    assert served == pytest.approx([float(cos[i]) for i in rows], abs=1e-5)


def test_bf16_training_runs_on_a_cpu(rows_dir, tiny_bert_dir, tmp_path):
    """Mixed precision on a CPU is autocast, which the trainer refuses unless told it runs on
    one: a bf16 run trains and saves float32 weights."""
    from safetensors.torch import load_file

    cfg = TrainConfig(
        base_model=str(tiny_bert_dir),
        student="bi",
        loss="margin-mse",
        epochs=1,
        batch_size=4,
        max_length=64,
        dev_dataset=None,
        bf16=True,
    )
    record = train([rows_dir], tmp_path / "s", cfg, device="cpu")
    assert record["config"]["bf16"] is True and record["examples"] == 20
    weights = load_file(str(tmp_path / "s" / "model.safetensors"))
    assert {str(w.dtype) for w in weights.values()} == {"torch.float32"}


def test_a_trained_student_is_loaded_as_the_kind_of_its_architecture():
    """`distill run` evaluates the student it trained through this: a bi-encoder loaded as a
    cross-encoder would be a classification head on random weights."""
    assert kind_of(student_kind(TrainConfig(student="bi"))).embeds
    assert not kind_of(student_kind(TrainConfig())).embeds
