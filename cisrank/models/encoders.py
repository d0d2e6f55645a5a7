"""Bi-encoder loading: one path for dense reranking and dense indexing.

Both must embed with the same model in the same precision, or a dense index built offline would
not match the queries encoded at serve time. The precision is the project's policy
(`cisrank.devices.resolve_dtype`: bf16 on GPUs that support it, fp16 on older ones, float32 on
CPU) unless the caller names one; dense indexes record it in their manifest.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from cisrank.devices import resolve_device, resolve_dtype
from cisrank.errors import ModelNotFoundError
from cisrank.models.integrity import damaged_folder_error
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
    path = resolve_model(model)  # before the import of seconds: a bad name fails at once
    refuse_causal_lm(model, path)
    from safetensors import SafetensorError
    from sentence_transformers import SentenceTransformer

    dev = resolve_device(device)
    precision = resolve_dtype(dtype, dev)
    try:
        encoder = SentenceTransformer(path, device=str(dev))
    except SafetensorError as exc:  # a damaged or truncated weights file: not an OSError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotFoundError(
            f"cannot read the weights of bi-encoder '{model}' in {path} ({first}): a weights "
            "file is damaged or truncated; restore it"
        ) from exc
    except Exception as exc:
        # a cut tokenizer.json is "Unrecognized processing class", a cut modules.json a bare
        # JSONDecodeError: name the file instead
        damaged = damaged_folder_error("bi-encoder", model, path)
        if damaged is not None:
            raise damaged from None
        if isinstance(exc, OSError):
            raise ModelNotFoundError(
                f"cannot load bi-encoder '{model}' from {path}: {exc}"
            ) from exc
        raise
    if max_seq_length is not None:
        encoder.max_seq_length = max_seq_length
    return encoder.to(dtype=precision)


_CAUSAL_HEADS = ("ForCausalLM", "LMHeadModel")
"""How transformers names the classes of next-token models (`LlamaForCausalLM`,
`GPT2LMHeadModel`, `BertLMHeadModel` built as a decoder)."""


def causal_lm_architecture(folder: Path) -> str | None:
    """The causal-LM class a plain Hugging Face folder declares (its `config.json`), None for
    anything else, and for sentence-transformers folders (`modules.json`): those say how to pool
    themselves, LLM-based embedders (a `Qwen2ForCausalLM` with last-token pooling) included."""
    if (folder / "modules.json").is_file():
        return None
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None  # no readable config: the loader names what is wrong with the folder
    if not isinstance(config, dict):
        return None
    names = config.get("architectures") or []
    for name in names if isinstance(names, list) else []:
        if isinstance(name, str) and name.endswith(_CAUSAL_HEADS):
            return name
    return str(config.get("model_type", "a decoder")) if config.get("is_decoder") else None


def refuse_causal_lm(model: str, path: str) -> None:
    """Refuse a causal LM's folder as a bi-encoder. sentence-transformers would load it anyway,
    mean-pooling hidden states nobody trained to be pooled, and the dense reranker would rank
    with them: plausible-looking cosines that mean nothing (docs/reliability.md). A hub id that is
    not on this machine is checked by sentence-transformers' own loading, not here."""
    folder = Path(path)
    if not folder.is_dir():
        return
    architecture = causal_lm_architecture(folder)
    if architecture is not None:
        raise ModelNotFoundError(
            f"'{model}' is a causal language model ({architecture}), not a bi-encoder: the "
            "dense reranker needs a sentence-transformers model or an encoder such as "
            "all-MiniLM-L6-v2 (rank with a causal LM as the cis reranker)"
        )


def dtype_name(dtype: torch.dtype) -> str:
    """How manifests write a dtype ("bfloat16", not "torch.bfloat16")."""
    return str(dtype).removeprefix("torch.")
