"""Margin-MSE (Hofstätter et al., 2020): the student regresses the teacher's margin between two
passages of one query, so only differences within a query are taught, never its offset."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from cisrank.distill.losses.base import Examples, LossOptions, Query, StudentLoss, normalized_labels
from cisrank.errors import DataError


class MarginMSE(StudentLoss):
    """Each passage against `margin_pairs` others of its query drawn at random (seeded): the
    label is the difference of their (normalized) teacher scores; normalization only rescales
    margins per query."""

    name = "margin-mse"
    columns = ("query", "positive", "negative", "label")

    def examples(self, queries: Sequence[Query], options: LossOptions) -> Examples:
        rng = random.Random(options.seed)
        cols: dict[str, list[Any]] = {c: [] for c in self.columns}
        for q in queries:
            labels = normalized_labels(q["scores"], options.normalize)
            n = len(labels)
            if n < 2:
                continue
            for i in range(n):
                for _ in range(options.margin_pairs):
                    j = rng.randrange(n - 1)
                    j += j >= i
                    cols["query"].append(q["query"])
                    cols["positive"].append(q["passages"][i])
                    cols["negative"].append(q["passages"][j])
                    cols["label"].append(labels[i] - labels[j])
        if not cols["label"]:
            raise DataError(f"{self.name} needs queries with two or more passages")
        return Examples(cols)

    def module(self, model: Any) -> Any:
        from sentence_transformers.cross_encoder import losses

        return losses.MarginMSELoss(model)

    def bi_module(self, model: Any) -> Any:
        from sentence_transformers.sentence_transformer import losses

        from cisrank.distill.losses.bi import scaled_cosine

        return losses.MarginMSELoss(model, similarity_fct=scaled_cosine)
