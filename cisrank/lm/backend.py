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

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from cisrank.errors import CisrankError


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


# ------------------------------------------------------------------ converted CPU runtimes


class ConvertedBackend:
    """What the CPU runtimes (`ctranslate2_backend`, `onnx_backend`) share: a model converted once
    into a folder (`folder_key` names it in the cache), loaded in one of the runtime's compute
    types, scoring only. They keep no state between calls, so the engine feeds whole rows and
    scores stay independent of the batch. A subclass sets `name`, `compute_types` and `owner`
    (whose compute types an error names) and loads its runtime after this `__init__`."""

    name: ClassVar[str]
    compute_types: ClassVar[tuple[str, ...]]
    owner: ClassVar[str]
    supports_prefix_cache = False
    supports_decoding = False
    device = "cpu"

    def __init__(self, folder: str | Path, compute_type: str, model_name: str) -> None:
        if compute_type not in self.compute_types:
            raise CisrankError(
                f"compute type '{compute_type}' is not one of {self.owner}: "
                f"{', '.join(self.compute_types)}"
            )
        self.folder = Path(folder)
        self.model_name = model_name or self.folder.name
        self.compute_type = compute_type

    def prefix_state(self, prefix: Sequence[int]) -> None:
        return None

    def _no_prefix(self, cached: Any) -> None:
        """`score_rows` is given no prefix state: there is none to continue."""
        if cached is not None:
            raise CisrankError(f"the {self.name} backend keeps no prefix state")


def folder_key(folder: Path) -> str:
    """A short hash of the folder's resolved path and its files' names, sizes and mtimes: what
    identifies a model folder's content cheaply, so that editing or replacing the model makes a
    new conversion."""
    h = hashlib.sha256(str(folder.resolve()).encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        stat = path.stat()
        h.update(f"{path.relative_to(folder)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


def local_source(model: str, backend: str) -> Path:
    """The local Hugging Face folder of `model` (resolved as the torch backend resolves it),
    which a converted runtime is made from."""
    from cisrank.models.resolve import resolve_model

    source = Path(resolve_model(model))
    if not (source / "config.json").is_file():
        raise CisrankError(
            f"--backend {backend} needs a local model folder (config.json, weights); "
            f"'{model}' resolved to {source}"
        )
    return source
