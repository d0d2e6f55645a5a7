"""Every way a causal LM is loaded: a Hugging Face id, a local folder, a catalogue name (pulled
once by `cisrank models pull`) or a GGUF file, with one-line actionable errors.

A pulled folder is checked against the checksums of its pull before anything of it is read
(`resolve_model`). Any folder's weights must then cover every tensor its config names: a config
that does not match the weights (an edited layer count) would otherwise load with freshly
initialized tensors and rank with them; and a weights file that cannot be read is named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cisrank.errors import ModelNotFoundError
from cisrank.models.integrity import damaged_folder_error


def load_causal_lm(model: str, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any]:
    """(model on `device` in `dtype`, in eval mode; its tokenizer)."""
    from cisrank.models.resolve import resolve_model

    gguf = Path(model).expanduser()
    if gguf.suffix.lower() == ".gguf" and gguf.is_file():
        # A GGUF checkpoint file: transformers de-quantizes it at every load (tens of seconds);
        # `cisrank models pull` converts catalogue models once instead.
        path, extra = str(gguf.parent), {"gguf_file": gguf.name}
    else:
        path, extra = resolve_model(model), {}
    # after the name resolves: a bad name fails before the import of seconds
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **extra)
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, output_loading_info=True, **extra
        )
        lm, info = loaded
    except (OSError, ValueError) as exc:
        # a cut tokenizer.json was a bare JSON error and "pass a folder that holds a causal
        # LM", naming no file
        damaged = damaged_folder_error("causal LM", model, path)
        if damaged is not None:
            raise damaged from None
        raise ModelNotFoundError(
            f"cannot load causal LM '{model}' from {path}: {_first_line(exc)}; pass --model with "
            "a folder that holds a causal language model (config.json, weights, tokenizer)"
        ) from exc
    except SafetensorError as exc:  # a header or size that does not add up: not an OSError
        raise ModelNotFoundError(
            f"{_weights_file(path)}: cannot read the weights of causal LM '{model}' "
            f"({_first_line(exc)}): the file is damaged or truncated; restore it"
        ) from exc
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise ModelNotFoundError(
            f"{Path(path) / 'config.json'}: causal LM '{model}' names {len(missing)} tensor(s) its "
            f"weights do not hold ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): "
            "the config does not match the weights; restore the folder"
        )
    lm.to(device)
    lm.eval()
    return lm, tokenizer


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _weights_file(path: str) -> Path:
    """The weights file of a folder (the folder itself where there are several or none)."""
    folder = Path(path)
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    return files[0] if len(files) == 1 else folder
