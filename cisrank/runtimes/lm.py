"""The causal-LM task's interface: what a runtime computes for the engine (`cisrank.lm.engine`),
per-token log-probabilities of token rows.

The engine owns everything that is about tokens and requests: the tokenizer, BOS, deduplication,
length batching, context-length checks, shared contexts and the fingerprint of what it scores. A
backend owns the model and one hot loop: given rows of token ids and, for each row, where its
scored span starts, return the log-probability of every scored token (optionally after a prefix
whose state it has cached). A new runtime is one module implementing `LMBackend` with a loader
(`Loader`) and one row of the runtime table (`cisrank.runtimes.table`); nothing above changes.

The torch backend (`cisrank.runtimes.lm_torch`) also decodes (`cisrank.lm.decoding`); every other
backend serves scoring only (`CausalLMEngine.torch_backend` says so in one line).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from cisrank.errors import CisrankError

if TYPE_CHECKING:
    from cisrank.runtimes.lm_torch import TorchBackend


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


class Reference(Protocol):
    """The source model on the exact torch runtime (a `CausalLMEngine`, which the engine's floor
    hands in): what a converted runtime is made from, and whose fingerprint it records, so that
    prior stores know which model a converted runtime computed a prior with."""

    def fingerprint(self) -> str: ...

    def torch_backend(self) -> TorchBackend: ...


class Loader(Protocol):
    """A causal-LM row's loader in the runtime table: (backend, tokenizer) of `model` in
    `compute_type` (None: the runtime's default). `threads`: intra-op threads of a CPU runtime
    (None: torch's); `reference(folder)` builds the source's torch `Reference` for a converted
    runtime; `options`: the runtime's own (torch: `TorchBackend`'s)."""

    def __call__(
        self,
        model: str,
        compute_type: str | None,
        *,
        device: str | None = None,
        threads: int | None = None,
        reference: Callable[[Path], Reference] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[LMBackend, Any]: ...


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


def converted_options(
    name: str, device: str | None, compute_type: str | None, threads: int | None
) -> tuple[str, int]:
    """(compute type, threads) of a converted CPU runtime: float32 where none is asked for, and
    torch's thread count (`--threads-per-worker` sets it) where none is given."""
    if device not in (None, "auto", "cpu"):
        raise CisrankError(f"the {name} backend runs on the CPU here, not on '{device}'")
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    return (compute_type if compute_type not in (None, "auto") else "float32"), threads


def need_reference(
    reference: Callable[[Path], Reference] | None, name: str
) -> Callable[[Path], Reference]:
    if reference is None:
        raise CisrankError(
            f"the {name} backend converts its model from a torch reference: pass one"
        )
    return reference
