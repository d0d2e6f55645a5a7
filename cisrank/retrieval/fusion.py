"""Hybrid retrieval by reciprocal-rank fusion (Cormack, Clarke and Büttcher, SIGIR 2009).

`RRF(d) = sum over runs r of 1 / (k + rank_r(d))`, rank starting at 1, over each run's top `depth`.
Only ranks are used, so BM25 scores and cosine similarities need no calibration against each
other; `k` (60 in the paper) damps the weight of the very top ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pydantic import Field

from cisrank.config import ComponentConfig
from cisrank.data.types import SearchHit
from cisrank.errors import CisrankError
from cisrank.retrieval.base import DocumentStore, Retriever


class FusionConfig(ComponentConfig):
    """How several first stages are fused (CLI `search`, `eval --first-stage` and the API alike)."""

    label: ClassVar[str] = "fusion"

    k: float = Field(default=60.0, ge=0.0, description="RRF's k constant (60 in the paper).")
    depth: int = Field(default=100, ge=1, description="Hits per index fed into fusion.")


def rrf(rankings: Sequence[Sequence[str]], k: float | None = None) -> list[tuple[str, float]]:
    """Fuse ranked docid lists; best first, ties broken by first appearance across the runs."""
    if k is None:
        k = FusionConfig().k
    if k < 0:
        raise CisrankError(f"RRF k must be >= 0, got {k}")
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, docid in enumerate(ranking, 1):
            scores[docid] = scores.get(docid, 0.0) + 1.0 / (k + rank)
    order = {d: i for i, d in enumerate(scores)}
    return sorted(scores.items(), key=lambda p: (-p[1], order[p[0]]))


class FusionRetriever:
    """Several retrievers over the same corpus, fused by RRF over each one's top `depth`."""

    name = "rrf"
    docs: DocumentStore | None = None  # no store of its own (each fused index has one)

    def __init__(
        self, retrievers: Sequence[Retriever], k: float | None = None, depth: int | None = None
    ) -> None:
        if not retrievers:
            raise CisrankError("fusion needs at least one retriever")
        self.config = FusionConfig().replace(k=k, depth=depth)
        self.retrievers = list(retrievers)
        self.k = self.config.k
        self.depth = self.config.depth
        self.name = "rrf(" + ",".join(r.name for r in self.retrievers) + ")"

    def search(self, query: str, k: int = 10) -> list[SearchHit]:
        return self.batch_search([query], k)[0]

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[SearchHit]]:
        depth = max(self.depth, k)
        per_engine = [r.batch_search(queries, depth) for r in self.retrievers]
        out = []
        for qi in range(len(queries)):
            lists = [engine[qi] for engine in per_engine]
            text = {h.docid: h.text for hits in lists for h in hits}
            fused = rrf([[h.docid for h in hits] for hits in lists], self.k)[:k]
            out.append([SearchHit(d, s, text[d]) for d, s in fused])
        return out
