"""Rerankers: one interface (`Reranker`), built from a `RerankerSpec` (`load_reranker` by name)."""

from cisrank.data.types import RankedPassage, rank_order
from cisrank.rerank.base import BaseReranker, CombiningReranker, IdentityReranker, Reranker
from cisrank.rerank.registry import available, load_reranker

__all__ = [
    "BaseReranker",
    "CISReranker",
    "CombiningReranker",
    "IdentityReranker",
    "RankedPassage",
    "Reranker",
    "available",
    "load_reranker",
    "rank_order",
]


def __getattr__(name: str):
    # CISReranker pulls in torch and transformers: import it only when asked for.
    if name == "CISReranker":
        from cisrank.rerank.cis import CISReranker

        return CISReranker
    raise AttributeError(f"module 'cisrank.rerank' has no attribute {name!r}")
