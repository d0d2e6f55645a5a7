"""Student losses by name, one `LossKind` record each: what `TrainConfig.loss` picks from.

A record holds the loss's name and the few words `--loss`'s help says of it; its module (one per
loss: `mse`, `margin_mse`, `listwise`) holds the loss itself (`StudentLoss`: the example columns,
how they are built, the sentence-transformers loss, the sampler), imported only when a student is
trained, so the CLI and `TrainConfig` read the names without torch. A new loss is its module and
one record here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cisrank.distill.losses.base import Examples, LossOptions, Query, StudentLoss, normalized_labels
from cisrank.errors import DataError


@dataclass(frozen=True)
class LossKind:
    name: str
    summary: str
    """What one training example is, for `--loss`'s help."""
    load: Callable[[], StudentLoss]
    """Imports the loss's module (a static import inside a function) and makes the loss."""


def _mse() -> StudentLoss:
    from cisrank.distill.losses.mse import MSE

    return MSE()


def _margin_mse() -> StudentLoss:
    from cisrank.distill.losses.margin_mse import MarginMSE

    return MarginMSE()


def _listwise() -> StudentLoss:
    from cisrank.distill.losses.listwise import ListNet

    return ListNet()


LOSSES: dict[str, LossKind] = {
    k.name: k
    for k in (
        LossKind("mse", "each pair's label", _mse),
        LossKind(
            "margin-mse",
            "each pair of a query's passages: the difference of their labels",
            _margin_mse,
        ),
        LossKind(
            "listwise",
            "each query's list: softmax cross-entropy between the teacher's and the student's "
            "distributions over it, ListNet",
            _listwise,
        ),
    )
}
"""Every student loss, in the order `--loss`'s help lists them."""

NAMES = tuple(LOSSES)


def loss_help() -> str:
    """`--loss`'s help: each loss by name with what one of its examples is."""
    named = [f"{k.name} ({k.summary})" for k in LOSSES.values()]
    return ", ".join(named[:-1]) + " or " + named[-1] + "."


def load_loss(name: str) -> StudentLoss:
    """The loss named `name`, its module imported."""
    kind = LOSSES.get(name)
    if kind is None:
        raise DataError(f"unknown loss '{name}': choose one of {', '.join(LOSSES)}")
    return kind.load()


__all__ = [
    "LOSSES",
    "NAMES",
    "Examples",
    "LossKind",
    "LossOptions",
    "Query",
    "StudentLoss",
    "load_loss",
    "normalized_labels",
]
