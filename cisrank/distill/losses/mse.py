"""MSE: the student regresses each pair's label (the recipe of sentence-transformers'
`train_cross_encoder_kd_mse.py`, and of the CIS paper's distillation)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cisrank.distill.losses.base import Examples, LossOptions, Query, StudentLoss, normalized_labels


class MSE(StudentLoss):
    """One row per (query, passage): its (normalized) teacher score as the label."""

    name = "mse"
    columns = ("query", "passage", "label")

    def examples(self, queries: Sequence[Query], options: LossOptions) -> Examples:
        cols: dict[str, list[Any]] = {c: [] for c in self.columns}
        for q in queries:
            labels = normalized_labels(q["scores"], options.normalize)
            cols["query"] += [q["query"]] * len(labels)
            cols["passage"] += q["passages"]
            cols["label"] += labels
        return Examples(cols)

    def module(self, model: Any) -> Any:
        from sentence_transformers.cross_encoder import losses

        return losses.MSELoss(model)

    def bi_module(self, model: Any) -> Any:
        from cisrank.distill.losses.bi import PairMSELoss

        return PairMSELoss(model)
