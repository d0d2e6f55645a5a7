"""The first-stage interface: every retriever (bm25s, Lucene, dense FAISS, fusion) looks the same.

The reranker needs passage text, so a search hit carries it (from the index's document store).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from cisrank.data.types import SearchHit


@runtime_checkable
class Retriever(Protocol):
    """Top-k search over one corpus; hits best first with strictly comparable scores."""

    name: str

    def search(self, query: str, k: int = 10) -> list[SearchHit]: ...

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[SearchHit]]: ...
