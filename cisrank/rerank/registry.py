"""Rerankers by name, so the CLI, the API config and eval build them the same way.

Each entry imports its implementation lazily: `cisrank eval --reranker none` must not pay for torch
model imports, and optional backends must fail with the extra to install, not at import time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from cisrank.errors import CisrankError, UnknownRerankerError
from cisrank.rerank.base import IdentityReranker, Reranker

_CONFIGS: dict[str, tuple[str, str]] = {
    "dense": ("cisrank.rerank.dense", "DenseRerankerConfig"),
    "cis": ("cisrank.rerank.cis", "CISRerankerConfig"),
    "cross-encoder": ("cisrank.rerank.cross_encoder", "CrossEncoderRerankerConfig"),
    "hybrid": ("cisrank.rerank.hybrid", "HybridRerankerConfig"),
}


def config_fields(name: str) -> set[str]:
    """The options reranker kind `name` takes (its config's fields)."""
    module, attr = _CONFIGS[name]
    return set(getattr(importlib.import_module(module), attr).model_fields)


def _check_options(name: str, options: dict[str, Any]) -> None:
    """Reject the flags of another reranker by their flag names (`--template` given to dense),
    saying whose they are: the CLI passes every reranker-specific flag to whichever is chosen."""
    unknown = sorted(set(options) - config_fields(name))
    if not unknown:
        return
    flags = ", ".join("--" + k.replace("_", "-") for k in unknown)
    owner = next(
        (n for n in _CONFIGS if n not in (name, "hybrid") and set(unknown) <= config_fields(n)),
        None,
    )
    whose = f"option(s) of the {owner} reranker, not of {name}" if owner else "not options"
    valid = ", ".join(sorted(config_fields(name)))
    raise CisrankError(f"{flags}: {whose}; drop them ({name} takes {valid})")


def _dense(model: str | None, **options: Any) -> Reranker:
    from cisrank.rerank.dense import DenseReranker

    _check_options("dense", options)
    return DenseReranker(model=model, **options)


def _cis(model: str | None, **options: Any) -> Reranker:
    from cisrank.rerank.cis import CISReranker

    _check_options("cis", options)
    return CISReranker(model=model, **options)


def _cross_encoder(model: str | None, **options: Any) -> Reranker:
    from cisrank.rerank.cross_encoder import CrossEncoderReranker

    _check_options("cross-encoder", options)
    return CrossEncoderReranker(model=model, **options)


def _hybrid(model: str | None, **options: Any) -> Reranker:
    """Options are the hybrid's own plus those of its components, which it routes and checks."""
    from cisrank.rerank.hybrid import HybridReranker

    return HybridReranker(model=model, **options)


_FACTORIES: dict[str, Callable[..., Reranker]] = {
    "dense": _dense,
    "cis": _cis,
    "cross-encoder": _cross_encoder,
    "hybrid": _hybrid,
}

NO_RERANKER = "none"


def available() -> list[str]:
    return [NO_RERANKER, *sorted(_FACTORIES)]


def check_name(name: str) -> str:
    if name != NO_RERANKER and name not in _FACTORIES:
        raise UnknownRerankerError(
            f"unknown reranker '{name}': choose one of {', '.join(available())}"
        )
    return name


def load_reranker(name: str, model: str | None = None, **options: Any) -> Reranker:
    """Build the named reranker; `none` gives the `IdentityReranker` (keep the input order),
    which takes no model and ignores the options the CLI passes to every reranker."""
    check_name(name)
    if name == NO_RERANKER:
        return IdentityReranker()
    options = {k: v for k, v in options.items() if v is not None}
    return _FACTORIES[name](model, **options)
