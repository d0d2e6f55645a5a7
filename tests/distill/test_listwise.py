"""The length-sorted ListNet loss equals sentence-transformers' ListNetLoss (value and every
gradient) and the formula computed by hand; only the order of the forward passes differs."""

from __future__ import annotations

import math

import pytest
import torch

from cisrank.distill.losses.listwise import (
    LengthSortedListNetLoss,
    length_sorted_chunks,
    listnet_loss,
)

QUERIES = ["red apples", "a river in france", "pianos"]
LISTS = [
    ["apples are red or green and grow on trees in orchards", "rivers", "red", "green apples"],
    ["the seine flows through paris", "france is a country in europe with many rivers"],
    ["a piano has 88 keys", "x", "grand pianos are large", "organs", "keys and hammers strike"],
]
LABELS = [[1.5, -1.0, 0.2, 0.7], [0.9, -0.9], [2.0, -1.5, 0.5, -0.4, 0.1]]


def test_chunks_are_length_sorted_and_cover_every_index_once():
    chunks = length_sorted_chunks([5, 1, 9, 3, 7], 2)
    assert chunks == [[1, 3], [0, 4], [2]]


def test_listnet_loss_is_the_cross_entropy_of_the_two_softmaxes_over_each_list():
    scores = torch.tensor([[0.3, -0.2, 1.0], [2.0, 0.5, 0.0]])
    labels = torch.tensor([[1.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    want = 0.0
    for s, y, m in zip(scores.tolist(), labels.tolist(), mask.tolist(), strict=True):
        s, y = (
            [v for v, k in zip(s, m, strict=True) if k],
            [v for v, k in zip(y, m, strict=True) if k],
        )
        zs, zy = sum(math.exp(v) for v in s), sum(math.exp(v) for v in y)
        want -= sum(
            math.exp(b) / zy * math.log(math.exp(a) / zs) for a, b in zip(s, y, strict=True)
        )
    assert listnet_loss(scores, labels, mask).item() == pytest.approx(want / 2, abs=1e-6)


def test_equals_sentence_transformers_listnet_in_value_and_gradient(tiny_bert_dir):
    from sentence_transformers.cross_encoder import CrossEncoder
    from sentence_transformers.cross_encoder.losses import ListNetLoss

    model = CrossEncoder(str(tiny_bert_dir), num_labels=1, max_length=64)
    model.model.eval()  # no dropout: both losses must see the same network
    labels = [torch.tensor(row) for row in LABELS]

    def run(loss):
        model.zero_grad()
        value = loss([QUERIES, LISTS], labels)
        value.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return value.item(), grads

    ours, g_ours = run(LengthSortedListNetLoss(model, mini_batch_size=3))
    ref, g_ref = run(ListNetLoss(model, mini_batch_size=3))
    assert ours == pytest.approx(ref, rel=1e-5)
    assert g_ours.keys() == g_ref.keys() and len(g_ours) > 10
    for name, g in g_ref.items():
        torch.testing.assert_close(g_ours[name], g, rtol=1e-4, atol=1e-6, msg=name)
