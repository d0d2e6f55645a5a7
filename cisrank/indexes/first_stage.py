"""Retrieval as the first stage of an evaluation: replace a dataset's given candidates with the
top `depth` of one index, or of several fused by RRF, for the dataset's own topics."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from cisrank.data.types import Dataset, Hit
from cisrank.retrieval.base import Retriever
from cisrank.retrieval.fusion import FusionRetriever
from cisrank.indexes.kinds import open_index


def open_retriever(
    indexes: Sequence[str | Path],
    fusion_k: float | None = None,
    depth: int | None = None,
    **options,
) -> Retriever:
    """One index as is; several fused by RRF over each one's top `depth` (None: `FusionConfig`'s
    defaults)."""
    engines = [open_index(p, **options) for p in indexes]
    return engines[0] if len(engines) == 1 else FusionRetriever(engines, k=fusion_k, depth=depth)


def retrieve_candidates(
    retriever: Retriever, topics: dict[str, str], depth: int = 100
) -> dict[str, list[Hit]]:
    """qid -> the retriever's top `depth` as eval `Hit`s (rank from 1); empty results are kept empty."""
    qids = list(topics)
    results = retriever.batch_search([topics[q] for q in qids], depth)
    return {
        qid: [Hit(h.docid, h.text, float(h.score), r) for r, h in enumerate(hits, 1)]
        for qid, hits in zip(qids, results, strict=True)
    }


def with_first_stage(
    dataset: Dataset,
    indexes: Sequence[str | Path],
    depth: int = 100,
    fusion_k: float | None = None,
) -> Dataset:
    """A copy of `dataset` whose candidates come from retrieval over `indexes`."""
    retriever = open_retriever(indexes, fusion_k=fusion_k, depth=depth)
    topics = {q: t for q, t in dataset.topics.items() if q in dataset.qrels or not dataset.qrels}
    candidates = retrieve_candidates(retriever, topics, depth)
    note = f"first stage: {retriever.name} top-{depth} from {', '.join(str(p) for p in indexes)}"
    return replace(dataset, candidates=candidates, notes=[*dataset.notes, note])
