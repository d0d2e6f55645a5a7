"""The one interface every reranker implements.

The API, eval and distillation code take any reranker through `Reranker`. Its one primitive is
`score_batch`: many (query, passages) requests at once, so that a reranker with a model can pack
passages of different queries into shared batches, and every caller (API batcher, eval,
distillation) gets that without asking whether the reranker can. `score` and `rerank` derive from
it. Ranking is derived from scores in one place (`rank_order`) so that every caller breaks ties
the same deterministic way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from cisrank.data.types import RankedPassage, rank_order

Request = tuple[str, Sequence[str]]


@runtime_checkable
class Reranker(Protocol):
    """Scores passages against queries; higher means more relevant."""

    name: str
    model_name: str
    # True only for a reranker whose scores restate the input order (`IdentityReranker`):
    # callers may then skip it, as eval does, and report the first stage alone.
    keeps_order: bool

    def score_batch(self, requests: Sequence[Request]) -> list[list[float]]:
        """One list of floats per (query, passages) request, in input order, one float per
        passage in input order. A passage's score must not depend on the other requests."""
        ...

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """One float per passage, in input order."""
        ...

    def rerank(
        self, query: str, passages: Sequence[str], top_n: int | None = None
    ) -> list[RankedPassage]:
        """Passages most relevant first, at most `top_n` of them."""
        ...


class BaseReranker(ABC):
    """Derives `score` and `rerank` from `score_batch`; subclasses only say how to score."""

    name: str = "base"
    model_name: str = ""
    keeps_order: bool = False

    @abstractmethod
    def score_batch(self, requests: Sequence[Request]) -> list[list[float]]: ...

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        return self.score_batch([(query, passages)])[0]

    def rerank(
        self, query: str, passages: Sequence[str], top_n: int | None = None
    ) -> list[RankedPassage]:
        if top_n is not None and top_n < 1:
            raise ValueError(f"top_n must be >= 1, got {top_n}")
        scores = self.score(query, passages) if passages else []
        order = rank_order(scores)[:top_n]
        return [RankedPassage(i, float(scores[i]), passages[i]) for i in order]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model_name!r})"


class IdentityReranker(BaseReranker):
    """No reranking (`--reranker none`): keeps the input order.

    Scores fall strictly with input position (n - i for n passages), so ranking by them gives the
    input order back; `keeps_order` tells callers that they may skip it altogether."""

    name = "none"
    model_name = ""
    keeps_order = True

    def score_batch(self, requests: Sequence[Request]) -> list[list[float]]:
        return [[float(len(p) - i) for i in range(len(p))] for _, p in requests]
