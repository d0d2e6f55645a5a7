"""The torch runtime of bi-encoders: `SentenceTransformer.encode` on the model's own modules.

Arithmetic:

- float32 on a CPU, where none is asked for: the exact reference every other runtime is
  measured against (and what every dense index built before runtimes existed holds);
- bfloat16 (asked for by name on a CPU; CPUs with native bf16 matmuls, AVX512-BF16 or AMX, are
  where it pays) under `torch.autocast`: the weights stay float32 and only the matrix products
  run in bf16, LayerNorm, softmax, pooling and normalization staying float32. On all-MiniLM-L6-v2
  over DL19 passages that moved a cosine less than bf16 weights did at the same speed
  (bench/dense_runtimes.py, bench/RESULTS.md), so autocast is the bf16 here (`options["bf16"] =
  "weights"` keeps the other, for that measurement);
- on a GPU the device's default precision (bf16, fp16 where bf16 is missing) as weights, as
  before runtimes existed, unless a type is named.

int8 is the onnx runtime's (`embedder_onnx`): torch's dynamic int8 is not offered for
bi-encoders.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from cisrank.devices import resolve_device, resolve_dtype
from cisrank.errors import CisrankError
from cisrank.models.encoders import load_sentence_transformer

BF16_MODES = ("autocast", "weights")


class TorchEmbedder:
    """A loaded `SentenceTransformer` as an `EmbedderBackend`."""

    name = "torch"
    lanes = None  # torch batches on its own intra-op threads

    def __init__(self, encoder: Any, *, compute_type: str, autocast: bool) -> None:
        self.encoder = encoder
        self.device = encoder.device
        self.compute_type = compute_type
        self.autocast = autocast
        self.tokenizer = encoder.tokenizer
        limit = encoder.max_seq_length
        self.max_length: int | None = limit if isinstance(limit, int) and limit > 0 else None

    @property
    def dimensions(self) -> int | None:
        dimensions = self.encoder.get_embedding_dimension()
        return int(dimensions) if dimensions else None

    def embed(self, texts: Sequence[str], batch_size: int, normalize: bool = True) -> np.ndarray:
        """`encode` (sentence-transformers sorts by length itself)."""
        scope = (
            torch.autocast(self.device.type, dtype=torch.bfloat16)
            if self.autocast
            else contextlib.nullcontext()
        )
        with torch.inference_mode(), scope:
            emb = self.encoder.encode(
                list(texts),
                batch_size=batch_size,
                convert_to_numpy=True,
                normalize_embeddings=normalize,
                show_progress_bar=False,
            )
        return np.asarray(emb, dtype=np.float32)


def load(
    model: str,
    compute_type: str | None,
    *,
    device: str | None = None,
    threads: int | None = None,
    max_length: int | None = None,
    options: Mapping[str, Any] | None = None,
) -> TorchEmbedder:
    """The table's loader (`cisrank.runtimes.table`): `model` on `device` (CUDA when present) in
    `compute_type` (None: float32 on a CPU, the device's default on a GPU). Threads are torch's
    own; `options["bf16"]` is how bf16 is computed on a CPU (`BF16_MODES`, autocast default)."""
    if compute_type == "int8":
        raise CisrankError(
            "dtype 'int8' is the onnx backend's for a bi-encoder: use backend 'onnx' with it "
            "(the torch backend computes in float32 or bfloat16)"
        )
    mode = (options or {}).get("bf16", "autocast")
    if mode not in BF16_MODES:
        raise CisrankError(f"bf16 {mode!r}: one of {', '.join(BF16_MODES)}")
    dev = resolve_device(device)
    asked = compute_type not in (None, "auto")
    dtype = resolve_dtype(compute_type if asked else None, dev)  # the policy: float32 on a CPU
    autocast = dtype == torch.bfloat16 and dev.type == "cpu" and mode == "autocast"
    weights = torch.float32 if autocast else dtype
    encoder = load_sentence_transformer(model, str(dev), max_length, dtype=weights)
    return TorchEmbedder(
        encoder.eval(), compute_type=str(dtype).removeprefix("torch."), autocast=autocast
    )
