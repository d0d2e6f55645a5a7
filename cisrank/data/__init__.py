"""Shared data types and readers: topics, qrels, candidates, TREC runs, corpora, index manifests;
the resume check of the offline jobs' shard files (`shards`).

The floor every engine stands on: it imports only the leaves (errors, fileio, env), never an
engine, so rerank/, retrieval/, indexes/, eval/ and distill/ can all read the same files the same
way.
"""
