"""Bi-encoder loading: one path for dense reranking and dense indexing.

Both must embed with the same model in the same precision, or a dense index built offline would
not match the queries encoded at serve time.
"""

from __future__ import annotations

from cisrank.devices import resolve_device
from cisrank.errors import ModelNotFoundError
from cisrank.models.resolve import resolve_model


def load_sentence_transformer(
    model: str, device: str | None = None, max_seq_length: int | None = None
):
    """Load a bi-encoder by id or path through sentence-transformers, with actionable errors."""
    from sentence_transformers import SentenceTransformer

    path = resolve_model(model)
    dev = resolve_device(device)
    try:
        encoder = SentenceTransformer(path, device=str(dev))
    except OSError as exc:
        raise ModelNotFoundError(f"cannot load bi-encoder '{model}' from {path}: {exc}") from exc
    if max_seq_length is not None:
        encoder.max_seq_length = max_seq_length
    if dev.type == "cuda":
        encoder.half()
    return encoder
