"""Shared data types and readers: topics, qrels, candidates, TREC runs, corpora, index manifests.

The floor every engine stands on: it imports only the leaves (errors, fileio, env), never an
engine, so rerank/, retrieval/, indexes/, eval/ and distill/ can all read the same files the same
way.
"""
