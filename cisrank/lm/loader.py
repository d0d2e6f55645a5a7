"""Every way a causal LM is loaded: a Hugging Face id, a local folder, a catalogue name (pulled
once by `cisrank models pull`) or a GGUF file, with one-line actionable errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cisrank.errors import ModelNotFoundError


def load_causal_lm(model: str, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any]:
    """(model on `device` in `dtype`, in eval mode; its tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cisrank.models.resolve import resolve_model

    gguf = Path(model).expanduser()
    if gguf.suffix.lower() == ".gguf" and gguf.is_file():
        # A GGUF checkpoint file: transformers de-quantizes it at every load (tens of seconds);
        # `cisrank models pull` converts catalogue models once instead.
        path, extra = str(gguf.parent), {"gguf_file": gguf.name}
    else:
        path, extra = resolve_model(model), {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **extra)
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **extra)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotFoundError(
            f"cannot load causal LM '{model}' from {path}: {first}; pass --model with a folder "
            "that holds a causal language model (config.json, weights, tokenizer)"
        ) from exc
    lm.to(device)  # type: ignore[arg-type]  # transformers' wrapper of to() hides its signature
    lm.eval()
    return lm, tokenizer
