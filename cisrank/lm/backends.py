"""Engines by backend name: a `CausalLMEngine` on any runtime of the table that serves causal LMs
(`cisrank.runtimes.table`: torch, exact, CPU or GPU, the default; ctranslate2 and onnx, CPU
runtimes in float32 or int8, optional extras), or on the one `auto` picks for the host
(`cisrank.runtimes.auto`, where the measurements behind the choice are).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cisrank.lm.engine import CausalLMEngine
from cisrank.runtimes.auto import resolve_lm_backend
from cisrank.runtimes.table import CAUSAL_LM, runtime

ENGINE_OPTIONS = ("batch_tokens", "batch_size", "max_padding", "fixed_shapes")
"""Options of the engine's batching; the others are the runtime's (torch: head_chunk_rows,
padding_side, use_prefix_cache)."""


def _reference(source: Path) -> CausalLMEngine:
    """The source model on the exact torch runtime in float32: what a converted runtime is
    exported from and identified by (its fingerprint keys the priors it computes)."""
    return CausalLMEngine(str(source), device="cpu", dtype="float32")


def load_engine(
    model: str,
    *,
    backend: str = "torch",
    device: str | None = None,
    dtype: str | None = None,
    threads: int | None = None,
    **options: Any,
) -> CausalLMEngine:
    """A `CausalLMEngine` for `model` on `backend` in `dtype` (the backend's compute type;
    default float32 on CPU, bf16 on a GPU for torch; `auto` as `resolve_lm_backend` says).
    `threads`: intra-op threads of a converted runtime (default: torch's, which
    `--threads-per-worker` sets); `options` are the engine's batching options and the
    runtime's own."""
    backend, dtype = resolve_lm_backend(backend, device, dtype)
    load = runtime(backend, CAUSAL_LM).load()
    lm, tokenizer = load(
        model,
        dtype,
        device=device,
        threads=threads,
        reference=_reference,
        options={k: v for k, v in options.items() if k not in ENGINE_OPTIONS},
    )
    return CausalLMEngine(
        lm, tokenizer, **{k: v for k, v in options.items() if k in ENGINE_OPTIONS}
    )
