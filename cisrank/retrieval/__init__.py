"""First-stage retrieval engines: bm25s and Lucene BM25, dense FAISS, reciprocal-rank fusion.

Engines open a built folder given its manifest; which engine opens which folder is decided one
floor up, in `cisrank.indexes.kinds` (`open_index`).
"""

from cisrank.retrieval.base import Retriever

__all__ = ["Retriever"]
