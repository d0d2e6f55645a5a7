"""Engines by backend name: `torch` (exact, CPU or GPU, the default), `ctranslate2` and `onnx`
(CPU runtimes with float32 and int8 compute types, optional extras), and `auto`, which picks one
for the host.

What each costs and gains on this project's CPU is measured in one interleaved run
(`bench/lm_backends.py`, bench/RESULTS.md: DL21, BM25 top 20, 1,060 pairs, one thread on an AVX2
host without VNNI). ONNX Runtime int8 scored 1.73x the torch engine's pairs/s at nDCG@10 -0.0048
(paired t-test p = 0.52), the only candidate over the adoption bar (>= 1.3x, <= 0.01 lost,
p > 0.05); CTranslate2 int8 was 1.53x at -0.0040, float32 ONNX 1.25x. `auto` means:

- torch on a GPU (bf16 there is what the hardware rewards; ONNX Runtime here is CPU only);
- torch where an exact float type is asked for (`--dtype float32`, ...);
- torch bf16 on a CPU with native bf16 matmuls (below);
- ONNX int8 on other CPUs where the `onnx` extra is installed; torch float32 where it is not;
- `CISRANK_LM_BACKEND` (torch, onnx, ctranslate2) overrides the choice process-wide.

torch's own compute type, where none is asked for: bf16 on a GPU, and bf16 on a CPU with native
bf16 matmuls (AVX512-BF16 or AMX; `CISRANK_CPU_BF16` overrides the detection), float32 on other
CPUs. On such a CPU (2 cores, AVX-512 BF16; bench/RESULTS.md, tenth session) bf16 scored DL21's
top 20 1.87x faster than float32 at nDCG@10 -0.0001 (p = 0.98), and DL19 at depth 100 at 0.5871
(float32 0.5860) in 7 minutes. `--dtype float32` keeps the exact scores (every test's brute-force
reference), and the engine's fingerprint names the compute type, so priors stay apart.

Why torch stays the default and `auto` is asked for by name: on DL19 at depth 100 (the issue's
acceptance run, 4,300 pairs) ONNX int8 scored nDCG@10 0.5720 against torch's 0.5860 and was only
about 1.3x faster on two workers: deeper lists carry more near-ties that quantization noise (up to
a few nats on a pair) reorders, which the depth-20 DL21 selection did not show.

int8 scores are not float32 scores, so a prior store keeps the priors of each backend and compute
type apart (the engine's fingerprint names them) and every teacher set records the backend that
really ran, never `auto`.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from cisrank import env
from cisrank.devices import cpu_has_native_bf16
from cisrank.errors import CisrankError
from cisrank.lm.backend import LMBackend
from cisrank.lm.engine import CausalLMEngine

log = logging.getLogger(__name__)

BACKENDS = ("auto", "torch", "ctranslate2", "onnx")
COMPUTE_TYPES = {
    "torch": ("float32", "bfloat16", "float16", "float64"),
    "ctranslate2": ("float32", "int8_float32", "int8"),
    "onnx": ("float32", "int8"),
}


def check_backend(backend: str, dtype: str | None) -> None:
    if backend not in BACKENDS:
        raise CisrankError(f"unknown LM backend '{backend}': one of {', '.join(BACKENDS)}")
    # torch also takes short names (bf16, fp32): its own resolver checks those
    if backend not in ("torch", "auto") and dtype not in (None, "auto", *COMPUTE_TYPES[backend]):
        raise CisrankError(
            f"--dtype {dtype} is not a compute type of the {backend} backend: one of "
            f"{', '.join(COMPUTE_TYPES[backend])}"
        )


def _on_gpu(device: str | None) -> bool:
    if device not in (None, "auto"):
        return not str(device).startswith("cpu")
    from cisrank.devices import resolve_device

    return resolve_device(None).type != "cpu"  # the engine's own rule: CUDA when present


def resolve_backend(
    backend: str, device: str | None = None, dtype: str | None = None
) -> tuple[str, str | None]:
    """The (backend, compute type) that `backend` and `dtype` ask for, `auto` made concrete by
    the rules of this module's docstring; other backends pass through, checked."""
    check_backend(backend, dtype)
    if backend == "torch":
        return backend, _torch_default_dtype(device, dtype)
    if backend != "auto":
        return backend, dtype
    forced = env.lm_backend()
    if forced is not None:
        if forced not in BACKENDS or forced == "auto":
            raise CisrankError(
                f"{env.LM_BACKEND}={forced!r} is not an LM backend: one of "
                f"{', '.join(b for b in BACKENDS if b != 'auto')}"
            )
        return resolve_backend(forced, device, dtype)
    if dtype == "int8":
        return "onnx", "int8"
    if dtype not in (None, "auto") or _on_gpu(device) or cpu_has_native_bf16():
        return "torch", _torch_default_dtype(device, dtype)
    if not _onnxruntime_installed():
        log.info("the onnx extra is not installed: the causal LM runs on torch float32")
        return "torch", dtype
    return "onnx", "int8"


def _torch_default_dtype(device: str | None, dtype: str | None) -> str | None:
    """bf16 on a CPU with native bf16 where no type is asked for; otherwise what was asked
    (None: the engine's default, bf16 on a GPU and float32 on a CPU)."""
    if dtype in (None, "auto") and not _on_gpu(device) and cpu_has_native_bf16():
        return "bfloat16"
    return dtype


def onnx_int8_fits(device: str | None, dtype: str | None) -> bool:
    """`auto`'s rule for ONNX Runtime int8, shared by the causal LM and the cross-encoder: a CPU
    (the engine's own device rule), no compute type asked for, onnxruntime installed."""
    return dtype in (None, "auto") and not _on_gpu(device) and _onnxruntime_installed()


def _onnxruntime_installed() -> bool:
    """The `onnx` extra as `auto` needs it: ONNX Runtime to run the export, and `onnx` to make
    it (a model not exported yet failed with torch's bare `OnnxExporterError` without it)."""
    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


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
    default float32 on CPU, bf16 on a GPU for torch; `auto` as `resolve_backend` says).
    `threads`: intra-op threads of a ctranslate2 or onnx runtime (default: torch's, which
    `--threads-per-worker` sets); `options` are the engine's batching options."""
    backend, dtype = resolve_backend(backend, device, dtype)
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
