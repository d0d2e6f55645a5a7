"""Rerankers by name, so the CLI, the API config and eval build them the same way.

Each entry imports its implementation lazily: `cisrank eval --reranker none` must not pay for torch
model imports, and optional backends must fail with the extra to install, not at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cisrank.errors import CisrankError, UnknownRerankerError
from cisrank.rerank.base import Reranker


def _dense(model: str | None, **options: Any) -> Reranker:
    from cisrank.config import DenseRerankerConfig
    from cisrank.rerank.dense import DenseReranker

    unknown = sorted(set(options) - set(DenseRerankerConfig.model_fields))
    if unknown:
        flags = ", ".join("--" + k.replace("_", "-") for k in unknown)
        owner = "cross-encoder" if set(unknown) <= {"quantize"} else "cis"
        raise CisrankError(f"{flags}: option(s) of the {owner} reranker, not of dense; drop them")
    return DenseReranker(DenseRerankerConfig(), model=model, **options)


def _cis(model: str | None, **options: Any) -> Reranker:
    from cisrank.rerank.cis import CISReranker

    return CISReranker(model=model, **options)


def _cross_encoder(model: str | None, **options: Any) -> Reranker:
    from cisrank.rerank.cross_encoder import CrossEncoderReranker, CrossEncoderRerankerConfig

    unknown = sorted(set(options) - set(CrossEncoderRerankerConfig.model_fields))
    if unknown:
        flags = ", ".join("--" + k.replace("_", "-") for k in unknown)
        valid = ", ".join(sorted(CrossEncoderRerankerConfig.model_fields))
        raise CisrankError(
            f"{flags}: not option(s) of the cross-encoder reranker (it takes {valid}); drop them"
        )
    return CrossEncoderReranker(model=model, **options)


_FACTORIES: dict[str, Callable[..., Reranker]] = {
    "dense": _dense,
    "cis": _cis,
    "cross-encoder": _cross_encoder,
}

NO_RERANKER = "none"


def register(name: str, factory: Callable[..., Reranker]) -> None:
    _FACTORIES[name] = factory


def available() -> list[str]:
    return [NO_RERANKER, *sorted(_FACTORIES)]


def check_name(name: str) -> str:
    if name != NO_RERANKER and name not in _FACTORIES:
        raise UnknownRerankerError(
            f"unknown reranker '{name}': choose one of {', '.join(available())}"
        )
    return name


def load_reranker(name: str, model: str | None = None, **options: Any) -> Reranker | None:
    """Build the named reranker; `none` gives None (keep the first-stage order)."""
    check_name(name)
    if name == NO_RERANKER:
        return None
    options = {k: v for k, v in options.items() if v is not None}
    return _FACTORIES[name](model, **options)
