"""cisrank: retrieval and reranking by causal relevance."""

__version__ = "0.1.0"
