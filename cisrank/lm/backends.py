"""Engines by backend name: `torch` (exact, CPU or GPU, the default), `ctranslate2` and `onnx`
(CPU runtimes with float32 and int8 compute types, optional extras).

What each costs and gains on this project's CPU is measured in one interleaved run
(`bench/lm_backends.py`, bench/RESULTS.md); a backend other than torch is only used when asked
(`--backend`), and a prior store keeps the priors of each backend and compute type apart (the
engine's fingerprint names them).
"""

from __future__ import annotations

from typing import Any

from cisrank.errors import CisrankError
from cisrank.lm.backend import LMBackend
from cisrank.lm.engine import CausalLMEngine

BACKENDS = ("torch", "ctranslate2", "onnx")
COMPUTE_TYPES = {
    "torch": ("float32", "bfloat16", "float16", "float64"),
    "ctranslate2": ("float32", "int8_float32", "int8"),
    "onnx": ("float32", "int8"),
}


def check_backend(backend: str, dtype: str | None) -> None:
    if backend not in BACKENDS:
        raise CisrankError(f"unknown LM backend '{backend}': one of {', '.join(BACKENDS)}")
    # torch also takes short names (bf16, fp32): its own resolver checks those
    if backend != "torch" and dtype not in (None, "auto", *COMPUTE_TYPES[backend]):
        raise CisrankError(
            f"--dtype {dtype} is not a compute type of the {backend} backend: one of "
            f"{', '.join(COMPUTE_TYPES[backend])}"
        )


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
    default float32 on CPU, bf16 on a GPU for torch). `threads`: intra-op threads of a
    ctranslate2 or onnx runtime (default: torch's, which `--threads-per-worker` sets); `options`
    are the engine's batching options."""
    check_backend(backend, dtype)
    if backend == "torch":
        return CausalLMEngine(model, device=device, dtype=dtype, **options)
    if device not in (None, "auto", "cpu"):
        raise CisrankError(f"the {backend} backend runs on the CPU here, not on '{device}'")
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    compute = dtype if dtype not in (None, "auto") else "float32"
    scoring = {
        k: v for k, v in options.items() if k in ("batch_tokens", "batch_size", "max_padding")
    }
    lm: LMBackend
    if backend == "ctranslate2":
        from cisrank.lm.ctranslate2_backend import load_ctranslate2

        lm, tokenizer = load_ctranslate2(model, compute, threads)
    else:
        from cisrank.lm.onnx_backend import load_onnx

        lm, tokenizer = load_onnx(model, compute, threads)
    return CausalLMEngine(lm, tokenizer, **scoring)
