"""What a causal-LM backend computes for the engine: per-token log-probabilities of token rows.

The engine (`cisrank.lm.engine`) owns everything that is about tokens and requests: the
tokenizer, BOS, deduplication, length batching, context-length checks, shared contexts and the
fingerprint of what it scores. A backend owns the model and one hot loop: given rows of token ids
and, for each row, where its scored span starts, return the log-probability of every scored token
(optionally after a prefix whose state it has cached). A new backend (another runtime, another
compute type) is one more module implementing `LMBackend`; nothing above `lm/` changes.

The torch backend (`cisrank.lm.torch_backend`) also decodes (`lm.decoding`); a backend that cannot
(`supports_decoding = False`) serves scoring only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class LMBackend(Protocol):
    """One causal LM behind a runtime. `rows` are token-id sequences that each start with BOS;
    row r's scored span is `rows[r][context[r]:]`; results are float32 log-probabilities of
    the scored tokens, concatenated in row order."""

    @property
    def name(self) -> str:
        """The runtime ("torch", "ctranslate2", ...)."""
        ...

    @property
    def model_name(self) -> str:
        """What error messages call the model."""
        ...

    @property
    def compute_type(self) -> str:
        """What it computes in ("float32", "bfloat16", "int8", ...)."""
        ...

    @property
    def device(self) -> str: ...

    @property
    def max_positions(self) -> int | None:
        """The model's context length, where its config says."""
        ...

    @property
    def num_layers(self) -> int: ...

    @property
    def supports_prefix_cache(self) -> bool:
        """Whether `prefix_state` can return a reusable state (else the engine feeds whole
        rows)."""
        ...

    @property
    def supports_decoding(self) -> bool: ...

    def score_rows(
        self, rows: Sequence[Sequence[int]], context: Sequence[int], pad_id: int, cached: Any = None
    ) -> np.ndarray:
        """Log-probabilities of every row's scored span; with `cached` (from `prefix_state`)
        each row continues that prefix (and a span may then start at index 0)."""
        ...

    def prefix_state(self, prefix: Sequence[int]) -> Any | None:
        """The prefix run once, as a state `score_rows` can continue; None when it cannot."""
        ...

    def identity(self) -> list[bytes]:
        """What changes a log-probability, as bytes the engine hashes into its fingerprint: the
        model's config, the compute type, a sample of the weights."""
        ...
