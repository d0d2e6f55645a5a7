"""Distillation: score (query, passage) pairs with a teacher, train a cross-encoder student on them.

`generate` writes teacher rows as Parquet shards, `train` fits a sentence-transformers CrossEncoder
to them with an MSE-type loss, and `run` chains both with an evaluation of the student.
"""
