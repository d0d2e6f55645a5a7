"""The student losses over a bi-encoder: the query and the passage embedded apart, a pair scored
by the cosine of their embeddings times `BI_SCALE`.

Why a bi-encoder student: it keeps the pre-training of the sentence-transformers model it starts
from (all-MiniLM-L6-v2 ranks DL21 at 0.5775 before any training, where a cross-encoder made from
it starts from a random head), and a passage's embedding does not depend on the query, so a
server embeds a passage once for every query that sends it.

Why a scale: the labels are the teacher's scores standardized per query (`normalize="query"`),
while a cosine moves within [-1, 1]. Over the training lists of the MS MARCO queries (the top 20
of BM25 and a bi-encoder), all-mpnet-base-v2's cosines have a median standard deviation of 0.167
per query (teachers/msmarco-train-top20.parquet): a standardized label of 1 is a cosine of about
1/6, so `BI_SCALE` = 6 puts the student's scores in the labels' units from the first step (a
scale does not change a ranking; the served scores are the plain cosines).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from cisrank.distill.losses.listnet import listnet_loss

BI_SCALE = 6.0


def scaled_cosine(a: Tensor, b: Tensor) -> Tensor:
    """`BI_SCALE` times the cosine of each row of `a` with the same row of `b`."""
    return BI_SCALE * torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)


class PairMSELoss(nn.Module):
    """MSE between `scaled_cosine(query, passage)` and each pair's label; called by
    sentence-transformers' trainer as `loss(features, labels)` with the query and passage
    columns tokenized."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, sentence_features: Sequence[dict[str, Tensor]], labels: Tensor) -> Tensor:
        q, p = (self.model(f)["sentence_embedding"] for f in sentence_features)
        return nn.functional.mse_loss(scaled_cosine(q, p), labels.float())

    def get_config_dict(self) -> dict[str, Any]:
        return {"scale": BI_SCALE}


class BiListNetLoss(nn.Module):
    """ListNet (the cross-encoder's `listnet_loss`) over each query's list, the student's scores
    `scaled_cosine(query, passage)`. The trainer tokenizes each column apart, so a list comes
    as columns of equal length (`ListNet.bi_examples`): the query, then its passages, a shorter
    list padded with passages whose label is NaN and which the loss leaves out."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, sentence_features: Sequence[dict[str, Tensor]], labels: Tensor) -> Tensor:
        q, *docs = (self.model(f)["sentence_embedding"] for f in sentence_features)
        scores = torch.stack([scaled_cosine(q, d) for d in docs], dim=1)
        labels = labels.float().to(scores.device)
        return listnet_loss(scores, labels, ~labels.isnan())

    def get_config_dict(self) -> dict[str, Any]:
        return {"scale": BI_SCALE}
