"""cisrank: retrieval and reranking by causal relevance.

The Python API, every reranker kind behind one call:

    import cisrank

    reranker = cisrank.load_reranker("dense", model="all-MiniLM-L6-v2")
    for hit in reranker.rank("who wrote hamlet?", documents, top_n=3):
        print(hit.index, hit.score, hit.document)

`load_reranker(kind, model=None, **options)` takes the kinds `cis`, `cross-encoder`, `dense`,
`hybrid` and `none`, a model name or folder (the kind's default when None) and the kind's options
as keywords (`cisrank.rerank.configs`); `rank(query, documents, top_n=None)` returns the documents
best first, each a `RankedPassage` with its `index` in `documents`, its `score` and the `document`.
`rank(..., chunking=cisrank.Chunking(max_chunks_per_doc=8))` cuts long documents into windows of
the model's length, scores each and ranks a document by its best: each result then carries its
`best_chunk` (a character span and its score), as `/v1/rerank` answers.

`import cisrank` stays light (no torch): these names load on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from cisrank.version import __version__

if TYPE_CHECKING:
    from cisrank.data.types import BestChunk, RankedPassage
    from cisrank.rerank.base import Reranker
    from cisrank.rerank.chunking import Chunking
    from cisrank.rerank.registry import load_reranker

_HOME = {
    "load_reranker": "cisrank.rerank.registry",
    "Reranker": "cisrank.rerank.base",
    "RankedPassage": "cisrank.data.types",
    "BestChunk": "cisrank.data.types",
    "Chunking": "cisrank.rerank.chunking",
}

__all__ = ["BestChunk", "Chunking", "RankedPassage", "Reranker", "__version__", "load_reranker"]


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'cisrank' has no attribute {name!r}")
    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
