"""The data types every floor above shares: what a first stage returns, what a reranker returns,
what a corpus yields and what an evaluation reads.

They live below every engine so that retrieval, reranking, indexing and evaluation exchange plain
values instead of importing each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class Hit:
    """A first-stage candidate: passage id and text with its first-stage score and rank."""

    docid: str
    text: str
    score: float
    rank: int


@dataclass
class Dataset:
    """Queries, graded judgments and first-stage candidates of one evaluation set."""

    name: str
    topics: dict[str, str]
    qrels: dict[str, dict[str, int]]
    candidates: dict[str, list[Hit]]
    source: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def qids(self) -> list[str]:
        """Queries that have both text and candidates, in topic-file order."""
        return [q for q in self.topics if q in self.candidates]

    def passages(self) -> dict[str, str]:
        """Distinct passages of all candidate lists (the pool corpus), first text seen wins."""
        pool: dict[str, str] = {}
        for hits in self.candidates.values():
            for h in hits:
                pool.setdefault(h.docid, h.text)
        return pool


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One first-stage result; it carries the passage text because rerankers need it."""

    docid: str
    score: float
    text: str


@dataclass(frozen=True, slots=True)
class BestChunk:
    """The best-scoring window of a chunked document: its character span in the document as it
    was sent (`text[start:end]`) and its score, so a RAG client can put that span, not the whole
    document, in its prompt."""

    start: int
    end: int
    score: float


@dataclass(frozen=True, slots=True)
class RankedPassage:
    """One reranked passage: its position in the input, its score and its text (`document`
    too, the name `Reranker.rank` gives it); `best_chunk` where it was ranked with chunking."""

    index: int
    score: float
    text: str
    best_chunk: BestChunk | None = None

    @property
    def document(self) -> str:
        return self.text


def rank_order(scores: Sequence[float]) -> list[int]:
    """Indices by descending score; ties keep input order (a stable sort), NaN ranks last."""
    arr = np.asarray(scores, dtype=np.float64)
    keyed = np.where(np.isnan(arr), -np.inf, arr)
    return [int(i) for i in np.argsort(-keyed, kind="stable")]


def check_top_n(top_n: int | None) -> None:
    """Refuse a `top_n` under 1: a slice would keep nothing for 0 and drop the last three for
    -3, silently."""
    if top_n is not None and top_n < 1:
        raise ValueError(f"top_n must be >= 1, got {top_n}")


def top_order(scores: Sequence[float], top_n: int | None = None) -> list[int]:
    """The cut every ranking makes: the best `top_n` indices by `rank_order` (all of them when
    None, fewer when there are fewer scores)."""
    check_top_n(top_n)
    return rank_order(scores)[:top_n]


@dataclass(frozen=True, slots=True)
class Passage:
    """One retrievable unit. `contents` (title and text) is what gets indexed and returned."""

    docid: str
    text: str
    title: str = ""

    @property
    def contents(self) -> str:
        return f"{self.title}\n{self.text}" if self.title else self.text
