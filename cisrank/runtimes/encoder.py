"""The sequence-classification task's interface: what a runtime computes for the cross-encoder
reranker (`cisrank.rerank.cross_encoder`), one logit per (query, passage) pair.

The reranker owns everything that is about pairs and requests: tokenization (longest-first
truncation to `max_length`), deduplication, length batching (`cisrank.runtimes.batching`), padding
(`Pads`) and putting scores back in input order. A backend owns the model: given a collated batch
(int64 `input_ids`, `attention_mask` and, where the model has them, `token_type_ids`), return each
row's first logit. So every runtime scores the same tokens in the same batches, and a new runtime
is one module implementing `EncoderBackend` with a loader (`Loader`) and one row of the runtime
table (`cisrank.runtimes.table`).

Runtimes: `encoder_torch` (exact float32, bf16 with a float32 head, torch's dynamic int8) and
`encoder_onnx` (an ONNX export run by ONNX Runtime, float32 or int8).
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from cisrank.runtimes.batching import pad_batch

if TYPE_CHECKING:
    import torch

UNSET_MAX_LENGTH = 1_000_000  # tokenizers without a limit report ~1e30


class EncoderBackend(Protocol):
    """A sequence-classification model with one logit behind a runtime."""

    @property
    def name(self) -> str:
        """The runtime ("torch", "onnx", ...)."""
        ...

    @property
    def compute_type(self) -> str:
        """What it computes in ("float32", "bfloat16", "int8", ...)."""
        ...

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype:
        """The float type around its products (float32 around int8 ones)."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The tokenizer the pairs are read with."""
        ...

    @property
    def max_length(self) -> int:
        """The model's own truncation length of a pair (`default_max_length`)."""
        ...

    @property
    def max_positions(self) -> int | None:
        """The model's position table, where its config says."""
        ...

    @property
    def lanes(self) -> Executor | None:
        """Threads that run its batches at once (ONNX int8, `int8_lanes`); None: one after
        the other."""
        ...

    def logits(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """The first logit of each row of a collated batch (`Pads.collate`), as float32."""
        ...


class Loader(Protocol):
    """A sequence-classification row's loader in the runtime table: the backend of `model` in
    `compute_type` (None: the runtime's default) on `device`, `threads` intra-op threads of a
    CPU runtime (None: torch's), `max_length` the pair length asked for (None: the model's),
    `options` the runtime's own (torch: `quantize`)."""

    def __call__(
        self,
        model: str,
        compute_type: str | None,
        *,
        device: str | None = None,
        threads: int | None = None,
        max_length: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> EncoderBackend: ...


def default_max_length(tokenizer: Any, config: Any) -> int:
    """The tokenizer's limit, as `predict` uses; the position table's where it has none."""
    limit = tokenizer.model_max_length
    if limit is None or limit > UNSET_MAX_LENGTH:
        limit = getattr(config, "max_position_embeddings", None) or 512
    return int(limit)


def model_input_names(tokenizer: Any) -> list[str]:
    """The token-level inputs the model is given besides the attention mask."""
    return [n for n in tokenizer.model_input_names if n in ("input_ids", "token_type_ids")]


class Pads:
    """How a tokenizer pads: token and token-type fillers, and the side."""

    def __init__(self, tokenizer: Any) -> None:
        self.token = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.token_type = getattr(tokenizer, "pad_token_type_id", 0) or 0
        self.left = getattr(tokenizer, "padding_side", "right") == "left"

    def collate(self, enc: dict[str, list[list[int]]], rows: list[int]) -> dict[str, np.ndarray]:
        """The rows of `enc`, padded to their longest, with the attention mask (int64)."""
        ids, mask, _ = pad_batch([enc["input_ids"][i] for i in rows], self.token, left=self.left)
        out = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in enc:
            types = [enc["token_type_ids"][i] for i in rows]
            out["token_type_ids"] = pad_batch(types, self.token_type, left=self.left)[0]
        return out
