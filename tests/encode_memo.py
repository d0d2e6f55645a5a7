"""Bi-encoder embeddings computed once per test session for texts that several slow tests embed.

The DL19 pool's dense index (tests/retrieval/test_dl19_pool.py) and the DL19 MiniLM reference
figures (tests/eval/test_reference_figures.py) embed the same 4,297 passages with
all-MiniLM-L6-v2: about 70-100 s each on 2 cores, a tenth of the suite. Inside `memo.active()`,
`SentenceTransformer.encode` embeds only the texts this session has not embedded yet with the same
model, precision and options, and returns the others' rows as they were computed. Each test still
runs its own code path end to end (reading, batching, FAISS, ranking, evaluation) and checks its
own reference figure; a row computed in another batch differs from a fresh one in the last bits
of float32 at most, far below the 4 decimals the figures are compared to.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np


class EncodeMemo:
    def __init__(self) -> None:
        self.rows: dict[tuple, np.ndarray] = {}
        self.encoded = 0  # texts actually embedded, for the tests that check the sharing
        self.served = 0  # texts answered from the memo

    @staticmethod
    def _model_key(encoder: Any, kwargs: dict[str, Any]) -> tuple:
        weights = next(encoder.parameters())
        options = tuple(
            sorted(
                (k, repr(v))
                for k, v in kwargs.items()
                if k not in {"batch_size", "show_progress_bar", "convert_to_numpy"}
            )
        )
        name = encoder[0].auto_model.config._name_or_path
        return (name, str(weights.dtype), str(weights.device), encoder.max_seq_length, options)

    @contextmanager
    def active(self) -> Iterator[EncodeMemo]:
        from sentence_transformers import SentenceTransformer

        original = SentenceTransformer.encode
        memo = self

        def encode(encoder, sentences, *args, **kwargs):
            as_numpy = kwargs.get("convert_to_numpy", True) and not kwargs.get("convert_to_tensor")
            if args or isinstance(sentences, str) or not as_numpy:
                return original(encoder, sentences, *args, **kwargs)
            key = memo._model_key(encoder, kwargs)
            texts = list(sentences)
            missing = list(dict.fromkeys(t for t in texts if (key, t) not in memo.rows))
            if missing:
                fresh = np.asarray(original(encoder, missing, **kwargs))
                for text, row in zip(missing, fresh, strict=True):
                    memo.rows[key, text] = row
            memo.encoded += len(missing)
            memo.served += len(texts) - len(missing)
            if not texts:
                return original(encoder, texts, **kwargs)
            return np.stack([memo.rows[key, t] for t in texts])

        SentenceTransformer.encode = encode
        try:
            yield self
        finally:
            SentenceTransformer.encode = original
