"""The runtime table: every runtime a model runs on, by task, in one place.

A runtime executes a model (torch, ONNX Runtime, CTranslate2); a task is what the model computes,
and each task has one interface that its runtimes implement (sentence-transformers' `backend/`
keys its ONNX and OpenVINO loaders by task the same way):

- `causal-lm`: log-probabilities of token rows, an `LMBackend` (`cisrank.runtimes.lm`), under the
  causal-LM engine of `cisrank.lm`: CIS, priors, the context gauge and orderings;
- `sequence-classification`: one logit per (query, passage) pair, an `EncoderBackend`
  (`cisrank.runtimes.encoder`), under the cross-encoder reranker;
- `feature-extraction`: one embedding per text, pooled and normalized as the model's
  sentence-transformers modules say, an `EmbedderBackend` (`cisrank.runtimes.embedder`), under
  the bi-encoder reranker (and so `/v1/embeddings` and the dense teacher).

A row names the runtime, the extra that installs it and, per task it serves, the compute types it
offers and its loader, named as `module:function` and imported only when that runtime is loaded:
the table imports no runtime library, so the configs' `Literal`s are made from it without
importing torch (`cisrank eval --reranker none` never does). `auto` is not a runtime: it is the
choice `cisrank.runtimes.auto` makes for the host.

Adding a runtime is one module (the task's interface and a loader) and one row here; the
`--backend` flags, the configs and the error messages that list runtimes read this table.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from cisrank.errors import CisrankError

CAUSAL_LM = "causal-lm"
SEQUENCE_CLASSIFICATION = "sequence-classification"
FEATURE_EXTRACTION = "feature-extraction"
Task = Literal["causal-lm", "sequence-classification", "feature-extraction"]


class Noun(NamedTuple):
    """What error messages call a task's models: one, several (words, not reranker kinds)."""

    one: str
    many: str


TASK_NOUNS: dict[str, Noun] = {
    CAUSAL_LM: Noun(one="causal LM", many="causal LMs"),
    SEQUENCE_CLASSIFICATION: Noun(one="cross-encoder", many="cross-encoders"),
    FEATURE_EXTRACTION: Noun(one="bi-encoder", many="bi-encoders"),
}

AUTO = "auto"


@dataclass(frozen=True)
class TaskRuntime:
    """One runtime's support of one task."""

    loader: str
    """`module:function` that loads a model on this runtime (see the task's interface)."""
    compute_types: tuple[str, ...] | None
    """What it computes in; None where the runtime's own dtype resolver checks the names (torch
    also takes short names: bf16, fp32)."""
    cpu_batch_size: int | None = None
    """Rows per model batch on a CPU (pairs of a cross-encoder, texts of a bi-encoder; the
    causal-LM engine batches under a token budget instead)."""

    def load(self) -> Callable[..., Any]:
        """The loader, imported now."""
        module, function = self.loader.split(":")
        return getattr(importlib.import_module(module), function)


@dataclass(frozen=True)
class Runtime:
    name: str
    extra: str | None
    """The pip extra that installs it (None: a dependency of cisrank)."""
    tasks: Mapping[str, TaskRuntime]


RUNTIMES: tuple[Runtime, ...] = (
    Runtime(
        "torch",
        None,
        {
            CAUSAL_LM: TaskRuntime("cisrank.runtimes.lm_torch:load", None),
            SEQUENCE_CLASSIFICATION: TaskRuntime(
                "cisrank.runtimes.encoder_torch:load", None, cpu_batch_size=32
            ),
            FEATURE_EXTRACTION: TaskRuntime(
                "cisrank.runtimes.embedder_torch:load", None, cpu_batch_size=16
            ),
        },
    ),
    Runtime(
        "ctranslate2",
        "ctranslate2",
        {
            CAUSAL_LM: TaskRuntime(
                "cisrank.runtimes.lm_ctranslate2:load", ("float32", "int8_float32", "int8")
            ),
        },
    ),
    Runtime(
        "onnx",
        "onnx",
        {
            CAUSAL_LM: TaskRuntime("cisrank.runtimes.lm_onnx:load", ("float32", "int8")),
            SEQUENCE_CLASSIFICATION: TaskRuntime(
                "cisrank.runtimes.encoder_onnx:load", ("float32", "int8"), cpu_batch_size=8
            ),
            FEATURE_EXTRACTION: TaskRuntime(
                "cisrank.runtimes.embedder_onnx:load", ("float32", "int8"), cpu_batch_size=16
            ),
        },
    ),
)
"""The cross-encoder's CPU batch by runtime (bench/archive/RESULTS-to-2026-12-02.md, "The
cross-encoder's batch on a CPU", bench/cross_encoder_batch.py): pairs sorted by length pad little at
any size, so the choice is about the runtime. torch at 32 never trails sentence-transformers'
CrossEncoder.rank on the same weights: 1.12x in float32 and 3.19x in bf16 on a quiet 2-core AVX-512
host, 1.05-1.19x in float32 with the other core busy, where 8 pairs fell to 0.70x (each batch is a
sync point of torch's threads, and a busy core stalls every one). ONNX Runtime float32 at 8; dynamic
int8 on any runtime: `DYNAMIC_INT8_CPU_BATCH_SIZE`. A bi-encoder's texts: 16 on either runtime
(torch's figure, bench/archive/RESULTS-to-2026-12-02.md: 1.2x faster than 32 on DL19 passages; ONNX
Runtime's taken from it, not yet measured on its own)."""
DYNAMIC_INT8_CPU_BATCH_SIZE = 1
"""Dynamic int8 (ONNX Runtime's, or torch's `quantize="int8"`) scores one pair at a time on a
CPU: its activation scale is taken over the whole batch tensor, so at 8 pairs a passage's score
moved by up to 0.135 with the passages batched beside it (its request's order, the other
requests a server batches with it); alone, a pair's score is a function of the pair, as the
float runtimes' are, at 0.90x the throughput of 8 pairs (2.51x the peer, with the other core
busy). A bi-encoder's int8 embeds one text a batch for the same reason: a passage's embedding is
then a function of the passage."""
_BY_NAME = {r.name: r for r in RUNTIMES}

BACKENDS: tuple[str, ...] = (AUTO, *_BY_NAME)
"""Every `--backend` value, `auto` first, in table order."""

if TYPE_CHECKING:
    BackendName = str
else:
    BackendName = Literal[BACKENDS]
"""The `backend` field of every config that picks a runtime (one flag, shared by the kinds)."""


def backends() -> tuple[str, ...]:
    """Every `--backend` value as the table stands now (`BACKENDS` is the same, fixed at import
    for the configs' `Literal`)."""
    return (AUTO, *_BY_NAME)


def names(task: str) -> tuple[str, ...]:
    """The runtimes that serve `task`, in table order (`auto` not included)."""
    return tuple(name for name, row in _BY_NAME.items() if task in row.tasks)


def runtime(name: str, task: str) -> TaskRuntime:
    """Row `name`'s support of `task` (the name already checked: `check`)."""
    return _BY_NAME[name].tasks[task]


def compute_types(name: str, task: str) -> tuple[str, ...]:
    """What row `name` computes `task` in (empty where its own dtype resolver checks)."""
    return runtime(name, task).compute_types or ()


def serves(name: str, task: str) -> bool:
    return name in _BY_NAME and task in _BY_NAME[name].tasks


def check_serves(name: str, task: str) -> None:
    """A runtime of the table that does not serve `task`: one line saying what it runs instead
    and which runtimes do."""
    row = _BY_NAME.get(name)
    if row is not None and task not in row.tasks:
        runs = " and ".join(TASK_NOUNS[t].many for t in row.tasks)
        raise ValueError(
            f"{name} runs {runs} only; a {TASK_NOUNS[task].one} runs on {' or '.join(names(task))}"
        )


def check_compute_type(name: str, task: str, dtype: str | None, *, flag: str = "--dtype") -> None:
    """`dtype` must be one of the runtime's compute types for `task` (None and `auto` leave the
    choice to it; a runtime without a list checks the names itself)."""
    types = runtime(name, task).compute_types
    if types is not None and dtype not in (None, AUTO, *types):
        shown = repr(dtype) if flag == "dtype" else dtype
        raise CisrankError(
            f"{flag} {shown} is not a compute type of the {name} backend: one of {', '.join(types)}"
        )
