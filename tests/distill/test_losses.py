"""Student losses as records: `TrainConfig.loss` takes the registry's names, and each loss holds its
example columns, its sentence-transformers loss and its sampler."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

import pytest

from cisrank.distill.config import TrainConfig
from cisrank.distill.losses import LOSSES, load_loss
from cisrank.distill.losses.sampling import length_grouped_batches
from cisrank.errors import DataError

QUERIES = [
    {"query": "qa", "passages": ["p", "long passage", "mid pas"], "scores": [3.0, 1.0, 2.0]},
    {"query": "query b", "passages": ["x", "yy"], "scores": [0.0, 5.0]},
    {"query": "c", "passages": ["alone"], "scores": [4.0]},
]


def test_the_loss_field_takes_the_registry_names_and_names_them_when_refused():
    assert get_args(TrainConfig.model_fields["loss"].annotation) == tuple(LOSSES)
    assert tuple(LOSSES) == ("mse", "margin-mse", "listwise")
    with pytest.raises(DataError, match="--loss must be 'mse', 'margin-mse' or 'listwise', got"):
        TrainConfig(loss="hinge")
    with pytest.raises(DataError, match="unknown loss 'hinge': choose one of mse, margin-mse, "):
        load_loss("hinge")


def test_the_loss_help_is_read_from_the_records_and_says_what_it_said():
    assert TrainConfig.model_fields["loss"].description == (
        "mse (each pair's label), margin-mse (each pair of a query's passages: the difference "
        "of their labels) or listwise (each query's list: softmax cross-entropy between the "
        "teacher's and the student's distributions over it, ListNet)."
    )


@pytest.mark.parametrize(
    ("name", "columns", "rows"),
    [
        ("mse", ("query", "passage", "label"), 6),
        ("margin-mse", ("query", "positive", "negative", "label"), 10),  # (3 + 2) x 2 pairs
        ("listwise", ("query", "docs", "labels"), 2),  # the list of one teaches nothing
    ],
)
def test_each_loss_builds_the_columns_it_declares_label_last(name, columns, rows):
    loss = load_loss(name)
    examples = loss.examples(QUERIES, TrainConfig(loss=name, margin_pairs=2))
    assert loss.name == name and type(loss).columns == columns
    assert tuple(examples.columns) == columns and len(examples) == rows


def test_pair_losses_batch_by_length_and_the_list_loss_takes_lists_whole():
    import datasets

    mse = load_loss("mse")
    ex = mse.examples(QUERIES, TrainConfig())
    # a pair's length: its query's characters plus its passage's
    lengths = [2 + 1, 2 + 12, 2 + 7, 7 + 1, 7 + 2, 1 + 5]
    assert ex.text_lengths() == lengths
    margin = load_loss("margin-mse").examples(QUERIES, TrainConfig(seed=3))
    assert margin.text_lengths() == [
        len(q) + max(len(a), len(b))
        for q, a, b in zip(
            margin.columns["query"],
            margin.columns["positive"],
            margin.columns["negative"],
            strict=True,
        )
    ]
    sampler_class = mse.sampler(ex)
    assert sampler_class is not None
    rows = datasets.Dataset.from_dict(ex.columns)
    sampler = sampler_class(rows, batch_size=4, drop_last=False, seed=7)
    assert list(sampler) == length_grouped_batches(lengths, 4, 7) and len(sampler) == 2
    sampler.set_epoch(1)  # another order each epoch
    assert list(sampler) == length_grouped_batches(lengths, 4, 8)
    listwise = load_loss("listwise")
    assert listwise.sampler(listwise.examples(QUERIES, TrainConfig())) is None


def test_each_loss_is_its_sentence_transformers_loss_over_the_student(ce_dir):
    from sentence_transformers.cross_encoder import CrossEncoder, losses

    from cisrank.distill.losses.listwise import LengthSortedListNetLoss

    model = CrossEncoder(str(ce_dir), device="cpu")
    want = {
        "mse": losses.MSELoss,
        "margin-mse": losses.MarginMSELoss,
        "listwise": LengthSortedListNetLoss,
    }
    for name, cls in want.items():
        module = load_loss(name).module(model)
        assert type(module) is cls and module.model is model
    assert load_loss("listwise").module(model).mini_batch_size == 32


def test_the_registry_and_the_config_load_no_training_stack():
    code = (
        "import sys, cisrank.distill.config, cisrank.distill.losses\n"
        "print([m for m in ('torch', 'sentence_transformers') if m in sys.modules])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]"]
