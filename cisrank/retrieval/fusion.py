"""Hybrid retrieval: several first stages fused by reciprocal-rank fusion (`cisrank.fusion.rrf`)
over each one's top `depth`.

Only ranks are used, so BM25 scores and cosine similarities need no calibration against each
other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pydantic import Field

from cisrank.config import ComponentConfig
from cisrank.data.types import SearchHit
from cisrank.errors import CisrankError
from cisrank.fusion import RRF_K, rrf
from cisrank.retrieval.base import DocumentStore, Retriever


class FusionConfig(ComponentConfig):
    """How several first stages are fused (CLI `search`, `eval --first-stage` and the API alike)."""

    label: ClassVar[str] = "fusion"

    k: float = Field(default=RRF_K, ge=0.0, description="RRF's k constant (60 in the paper).")
    depth: int = Field(default=100, ge=1, description="Hits per index fed into fusion.")


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
