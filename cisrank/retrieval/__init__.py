"""First-stage retrieval: bm25s and Lucene BM25, dense FAISS, reciprocal-rank fusion.

`open_index(path)` opens any built index folder as a `Retriever` (see `cisrank index build`).
"""

from cisrank.retrieval.base import Retriever, SearchHit
from cisrank.retrieval.opening import open_index

__all__ = ["Retriever", "SearchHit", "open_index"]
