"""Rerankers: one interface (`Reranker`), built by name through `load_reranker`."""

from cisrank.rerank.base import BaseReranker, RankedPassage, Reranker, rank_order
from cisrank.rerank.registry import available, load_reranker

__all__ = ["BaseReranker", "RankedPassage", "Reranker", "available", "load_reranker", "rank_order"]
