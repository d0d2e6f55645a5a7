"""Bi-encoder loading: one path for dense reranking and dense indexing.

Both must embed with the same model in the same precision, or a dense index built offline would
not match the queries encoded at serve time. The precision is the project's policy
(`cisrank.devices.resolve_dtype`: bf16 on GPUs that support it, fp16 on older ones, float32 on
CPU) unless the caller names one; dense indexes record it in their manifest.
"""

from __future__ import annotations

import torch

from cisrank.devices import resolve_device, resolve_dtype
from cisrank.errors import ModelNotFoundError
from cisrank.models.resolve import resolve_model


def load_sentence_transformer(
    model: str,
    device: str | None = None,
    max_seq_length: int | None = None,
    dtype: str | torch.dtype | None = None,
):
    """Load a bi-encoder by id or path through sentence-transformers, with actionable errors, on
    `device` in `dtype` (None: the device's default precision). A folder pulled by `cisrank
    models pull` is checked against its recorded checksums first (`resolve_model`)."""
    from safetensors import SafetensorError
    from sentence_transformers import SentenceTransformer

    path = resolve_model(model)
    dev = resolve_device(device)
    precision = resolve_dtype(dtype, dev)
    try:
        encoder = SentenceTransformer(path, device=str(dev))
    except OSError as exc:
        raise ModelNotFoundError(f"cannot load bi-encoder '{model}' from {path}: {exc}") from exc
    except SafetensorError as exc:  # a damaged or truncated weights file: not an OSError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotFoundError(
            f"cannot read the weights of bi-encoder '{model}' in {path} ({first}): a weights "
            "file is damaged or truncated; restore it"
        ) from exc
    if max_seq_length is not None:
        encoder.max_seq_length = max_seq_length
    return encoder.to(dtype=precision)


def dtype_name(dtype: torch.dtype) -> str:
    """How manifests write a dtype ("bfloat16", not "torch.bfloat16")."""
    return str(dtype).removeprefix("torch.")
