"""What a student loss is: the example columns it trains on (built from each query's teacher
scores), its sentence-transformers loss and its batch sampler.

Why objects: a loss is more than the module the trainer calls. MSE trains on (query, passage,
label) rows, margin-MSE on (query, positive, negative, margin) rows drawn at random within a query,
ListNet on one (query, list, labels) row per query; the pair losses batch rows of similar length
together, the list loss takes lists whole. Kept together per loss, a new loss is one module and
one registry row (`cisrank.distill.losses`), and `train` asks every loss the same questions.

No torch here: the registry's names and help are read by `TrainConfig`, which the CLI imports
without the training stack.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from cisrank.errors import DataError

if TYPE_CHECKING:
    from torch import nn

Query = dict[str, Any]
"""One query's training list: `query` (its text), `passages`, `ranks` (first-stage) and
`scores` (the teacher's), passages in first-stage order."""


class LossOptions(Protocol):
    """The training settings a loss reads (`TrainConfig` has them)."""

    @property
    def normalize(self) -> str: ...
    @property
    def margin_pairs(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def temperature(self) -> float: ...


@dataclass
class Examples:
    """Training inputs as parallel columns, one per loss input plus the label."""

    columns: dict[str, list[Any]]

    def __len__(self) -> int:
        return len(next(reversed(self.columns.values())))

    def text_lengths(self) -> list[int]:
        """Characters of each row's query and its longest passage: rows share the query, and
        the longest passage decides the padded length of a row."""
        texts = [v for v in list(self.columns.values())[:-1]]
        return [len(t[0]) + max(len(x) for x in t[1:]) for t in zip(*texts, strict=True)]


def normalized_labels(scores: Sequence[float], normalize: str) -> list[float]:
    """Per-query standardization (population std); a query with constant scores gets zeros,
    which still teaches the student that its passages are tied."""
    arr = np.asarray(scores, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise DataError("teacher scores contain NaN or infinity")
    if normalize == "none":
        return arr.tolist()
    std = arr.std()
    return ((arr - arr.mean()) / std if std > 0 else np.zeros_like(arr)).tolist()


class StudentLoss(ABC):
    """A student loss: `columns` (the label last) built by `examples`, the module the trainer
    calls (`module`) and the batch sampler of its training set (`sampler`)."""

    name: ClassVar[str]
    columns: ClassVar[tuple[str, ...]]
    """The training set's columns, in the order the loss takes them, its label column last."""

    @abstractmethod
    def examples(self, queries: Sequence[Query], options: LossOptions) -> Examples:
        """The training rows of `queries` (teacher scores normalized per `options.normalize`);
        a `DataError` where they hold none this loss can learn from."""

    @abstractmethod
    def module(self, model: Any) -> nn.Module:
        """The sentence-transformers loss over `model` (a `CrossEncoder`)."""

    @abstractmethod
    def bi_module(self, model: Any) -> nn.Module:
        """The same loss over a bi-encoder student (a `SentenceTransformer`), whose score of a
        pair is `BI_SCALE` times the cosine of their embeddings (`cisrank.distill.losses.bi`)."""

    def bi_examples(self, examples: Examples) -> Examples:
        """`examples` as a bi-encoder's trainer takes them (each column tokenized apart): the
        same columns for the pair losses."""
        return examples

    def sampler(self, examples: Examples) -> type | None:
        """The batch sampler class of the training set, or None for sentence-transformers'
        default. By default rows of similar length share batches (`length_grouped_sampler`):
        padding falls to a fraction, while batches stay random."""
        from cisrank.distill.losses.sampling import length_grouped_sampler

        return length_grouped_sampler(examples.text_lengths())
