"""The one interface every reranker implements.

The API, eval and distillation code take any reranker through `Reranker`: score a query against a
list of passages and get floats back in input order. Ranking is derived from scores in one place
(`rank_order`) so that every caller breaks ties the same deterministic way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from cisrank.data.types import RankedPassage, rank_order


@runtime_checkable
class Reranker(Protocol):
    """Scores passages against a query; higher means more relevant."""

    name: str
    model_name: str

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """One float per passage, in input order."""
        ...

    def rerank(
        self, query: str, passages: Sequence[str], top_n: int | None = None
    ) -> list[RankedPassage]:
        """Passages most relevant first, at most `top_n` of them."""
        ...


class BaseReranker(ABC):
    """Implements `rerank` on top of `score`; subclasses only say how to score."""

    name: str = "base"
    model_name: str = ""

    @abstractmethod
    def score(self, query: str, passages: Sequence[str]) -> list[float]: ...

    def score_many(self, requests: Sequence[tuple[str, Sequence[str]]]) -> list[list[float]]:
        """Score several (query, passages) pairs; rerankers that can share one model batch
        across queries override this (the API coalesces concurrent requests through it)."""
        return [self.score(q, p) for q, p in requests]

    def score_batch(self, requests: Sequence[tuple[str, Sequence[str]]]) -> list[list[float]]:
        return self.score_many(requests)

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
