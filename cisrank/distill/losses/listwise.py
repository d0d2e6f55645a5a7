"""ListNet (Cao et al., ICML 2007) for a cross-encoder, with the forward passes length-sorted.

The loss of a query is the cross-entropy between the teacher's distribution over its list,
softmax(labels), and the student's, softmax(scores): -sum_i p_teacher(i) log p_student(i),
averaged over the queries of a step. Rank-DistiLLM (Schlatt et al., ECIR 2025) distils LLM
rankings into cross-encoders with listwise losses of this kind.

Why not sentence-transformers' `ListNetLoss`: it cuts the flattened (query, passage) pairs of a
step into mini-batches in list order, so each mini-batch pads to the longest passage of whichever
queries it happens to cover (MS MARCO passages run from 20 to 250 tokens), where MSE's batches are
length-grouped. Here the pairs of a step are sorted by length before they are cut, and the scores
put back in list order; the loss and its gradient are the same (tests/distill/test_listwise.py).
Side by side on this CPU, an epoch of lists took about 1.1x the wall time of MSE over the same
pairs (bench/RESULTS.md); the sort's own gain was not measured apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from sentence_transformers.util import batch_to_device
from torch import Tensor, nn

from cisrank.distill.losses.base import Examples, LossOptions, Query, StudentLoss, normalized_labels
from cisrank.distill.losses.listnet import listnet_loss
from cisrank.errors import DataError

MINI_BATCH_PAIRS = 32
"""(query, passage) pairs per forward pass of a step's lists."""


def length_sorted_chunks(lengths: Sequence[int], size: int) -> list[list[int]]:
    """Indices cut into chunks of at most `size`, shortest first, so each chunk pads little."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[k : k + size] for k in range(0, len(order), size)]


class LengthSortedListNetLoss(nn.Module):
    """ListNet over each query's list; `mini_batch_size` pairs per forward pass, length-sorted.

    Called by sentence-transformers' CrossEncoderTrainer as `loss(inputs, labels)` with
    inputs = [queries, lists of passages] and labels one list of floats per query."""

    def __init__(self, model: Any, mini_batch_size: int = MINI_BATCH_PAIRS) -> None:
        super().__init__()
        self.model, self.mini_batch_size = model, mini_batch_size

    def forward(
        self,
        inputs: list[Any],
        labels: list[Any],
        prompt: str | None = None,
        task: str | None = None,
    ) -> Tensor:
        queries, lists = inputs
        pairs = [(q, p) for q, docs in zip(queries, lists, strict=True) for p in docs]
        chunks = length_sorted_chunks([len(q) + len(p) for q, p in pairs], self.mini_batch_size)
        outs = []
        for chunk in chunks:
            tokens = self.model.preprocess([pairs[i] for i in chunk], prompt=prompt, task=task)
            tokens = batch_to_device(tokens, self.model.device)
            outs.append(self.model(tokens)["scores"].view(-1).float())
        order = torch.tensor([i for chunk in chunks for i in chunk])
        scores = torch.cat(outs)[torch.argsort(order).to(outs[0].device)]
        sizes = [len(docs) for docs in lists]
        pad = nn.utils.rnn.pad_sequence
        flat_scores = pad(list(scores.split(sizes)), batch_first=True)
        flat_labels = pad(
            [torch.as_tensor(row, dtype=torch.float32) for row in labels], batch_first=True
        ).to(flat_scores.device)
        mask = pad([torch.ones(n, dtype=torch.bool) for n in sizes], batch_first=True)
        return listnet_loss(flat_scores, flat_labels, mask.to(flat_scores.device))

    def get_config_dict(self) -> dict[str, Any]:
        return {"mini_batch_size": self.mini_batch_size, "length_sorted": True}


class ListNet(StudentLoss):
    """One row per query with two passages or more: its list and the teacher's (normalized)
    scores divided by `temperature`, ListNet's target distribution after the loss's softmax.
    Lists are taken whole, in the default (random) sampler's batches."""

    name = "listwise"
    columns = ("query", "docs", "labels")

    def examples(self, queries: Sequence[Query], options: LossOptions) -> Examples:
        cols: dict[str, list[Any]] = {c: [] for c in self.columns}
        for q in queries:
            if len(q["passages"]) < 2:
                continue
            labels = normalized_labels(q["scores"], options.normalize)
            cols["query"].append(q["query"])
            cols["docs"].append(list(q["passages"]))
            cols["labels"].append([v / options.temperature for v in labels])
        if not cols["labels"]:
            raise DataError(f"{self.name} needs queries with two or more passages")
        return Examples(cols)

    def module(self, model: Any) -> nn.Module:
        return LengthSortedListNetLoss(model, mini_batch_size=MINI_BATCH_PAIRS)

    def bi_module(self, model: Any) -> nn.Module:
        from cisrank.distill.losses.bi import BiListNetLoss

        return BiListNetLoss(model)

    def bi_examples(self, examples: Examples) -> Examples:
        """The lists as columns a bi-encoder's trainer tokenizes one by one (`doc_0`, ...), as
        wide as the longest list: a shorter list (a query the first stage found fewer passages
        for) is padded with empty passages whose labels are NaN, which `BiListNetLoss` masks out,
        so it trains as its own list would alone."""
        n = max(len(d) for d in examples.columns["docs"])
        docs = [list(d) + [""] * (n - len(d)) for d in examples.columns["docs"]]
        labels = [list(v) + [math.nan] * (n - len(v)) for v in examples.columns["labels"]]
        cols: dict[str, list[Any]] = {"query": examples.columns["query"]}
        for i in range(n):
            cols[f"doc_{i}"] = [d[i] for d in docs]
        cols["labels"] = labels
        return Examples(cols)

    def sampler(self, examples: Examples) -> type | None:
        return None
