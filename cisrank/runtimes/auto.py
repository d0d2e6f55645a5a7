"""What `--backend auto` means, per task: the rules that pick a runtime of the table
(`cisrank.runtimes.table`) and its compute type for the host, measured before adopted.

The causal LM (`resolve_lm_backend`). What each runtime costs and gains on this project's CPU is
measured in one interleaved run (`bench/lm_backends.py`, bench/RESULTS.md: DL21, BM25 top 20,
1,060 pairs, one thread on an AVX2 host without VNNI). ONNX Runtime int8 scored 1.73x the torch
engine's pairs/s at nDCG@10 -0.0048 (paired t-test p = 0.52), the only candidate over the adoption
bar (>= 1.3x, <= 0.01 lost, p > 0.05); CTranslate2 int8 was 1.53x at -0.0040, float32 ONNX 1.25x.
`auto` means:

- torch on a GPU (bf16 there is what the hardware rewards; ONNX Runtime here is CPU only);
- torch where an exact float type is asked for (`--dtype float32`, ...);
- torch bf16 on a CPU with native bf16 matmuls (below);
- ONNX int8 on other CPUs where the `onnx` extra is installed; torch float32 where it is not;
- `CISRANK_LM_BACKEND` (torch, onnx, ctranslate2) overrides the choice process-wide.

torch's own compute type, where none is asked for: bf16 on a GPU, and bf16 on a CPU with native bf16
matmuls (AVX512-BF16 or AMX; `CISRANK_CPU_BF16` overrides the detection), float32 on other CPUs. On
such a CPU (2 cores, AVX-512 BF16; bench/archive/RESULTS-to-2026-12-02.md, tenth session) bf16
scored DL21's top 20 1.87x faster than float32 at nDCG@10 -0.0001 (p = 0.98), and DL19 at depth 100
at 0.5871 (float32 0.5860) in 7 minutes. `--dtype float32` keeps the exact scores (every test's
brute-force reference), and the engine's fingerprint names the compute type, so priors stay apart.

Why torch stays the CIS default and `auto` is asked for by name: on DL19 at depth 100 (4,300
pairs, bench/RESULTS.md) ONNX int8 scored nDCG@10 0.5720 against torch's 0.5860 and was only
about 1.3x faster on two workers: deeper lists carry more near-ties that quantization noise (up to
a few nats on a pair) reorders, which the depth-20 DL21 selection did not show.

int8 scores are not float32 scores, so a prior store keeps the priors of each backend and compute
type apart (the engine's fingerprint names them) and every teacher set records the backend that
really ran, never `auto`.

The cross-encoder (`resolve_encoder_backend`), whose default is `auto`: ONNX Runtime int8 on a CPU
where onnxruntime is installed and neither a dtype nor torch's quantization is asked for (the
student's fast path: bench/RESULTS.md, 2.29x torch float32 and 1.22x torch bf16 for the kept
student on an AVX-512 VNNI host, 1.7x-2.4x float32 on AVX2), torch otherwise (a GPU, no
onnxruntime), or what `CISRANK_ENCODER_BACKEND` names.
"""

from __future__ import annotations

import importlib.util
import logging

from cisrank import env
from cisrank.devices import cpu_has_native_bf16
from cisrank.errors import CisrankError
from cisrank.runtimes import table
from cisrank.runtimes.table import AUTO, CAUSAL_LM, SEQUENCE_CLASSIFICATION

log = logging.getLogger(__name__)


def check_lm_backend(backend: str, dtype: str | None) -> None:
    if backend != AUTO and not table.serves(backend, CAUSAL_LM):
        raise CisrankError(f"unknown LM backend '{backend}': one of {', '.join(table.backends())}")
    if backend != AUTO:
        table.check_compute_type(backend, CAUSAL_LM, dtype)


def _on_gpu(device: str | None) -> bool:
    if device not in (None, "auto"):
        return not str(device).startswith("cpu")
    from cisrank.devices import resolve_device

    return resolve_device(None).type != "cpu"  # the engine's own rule: CUDA when present


def resolve_lm_backend(
    backend: str, device: str | None = None, dtype: str | None = None
) -> tuple[str, str | None]:
    """The (backend, compute type) that `backend` and `dtype` ask of the causal LM, `auto` made
    concrete by the rules of this module's docstring; other backends pass through, checked."""
    check_lm_backend(backend, dtype)
    if backend == "torch":
        return backend, _torch_default_dtype(device, dtype)
    if backend != AUTO:
        return backend, dtype
    forced = env.lm_backend()
    if forced is not None:
        if not table.serves(forced, CAUSAL_LM):
            raise CisrankError(
                f"{env.LM_BACKEND}={forced!r} is not an LM backend: one of "
                f"{', '.join(table.names(CAUSAL_LM))}"
            )
        return resolve_lm_backend(forced, device, dtype)
    if dtype == "int8":
        return "onnx", "int8"
    if dtype not in (None, AUTO) or _on_gpu(device) or cpu_has_native_bf16():
        return "torch", _torch_default_dtype(device, dtype)
    if not _onnxruntime_installed():
        log.info("the onnx extra is not installed: the causal LM runs on torch float32")
        return "torch", dtype
    return "onnx", "int8"


def _torch_default_dtype(device: str | None, dtype: str | None) -> str | None:
    """bf16 on a CPU with native bf16 where no type is asked for; otherwise what was asked
    (None: the engine's default, bf16 on a GPU and float32 on a CPU)."""
    if dtype in (None, AUTO) and not _on_gpu(device) and cpu_has_native_bf16():
        return "bfloat16"
    return dtype


def resolve_encoder_backend(
    backend: str, device: str | None, dtype: str | None, quantize: str
) -> tuple[str, str | None]:
    """The (backend, dtype) of a cross-encoder: `auto` (the default) as this module's docstring
    says, other backends taken as asked (the config has checked they serve the task)."""
    if backend != AUTO:
        return backend, dtype
    forced = env.encoder_backend()
    if forced is not None:
        if not table.serves(forced, SEQUENCE_CLASSIFICATION):
            raise CisrankError(
                f"{env.ENCODER_BACKEND}={forced!r} is not a cross-encoder backend: "
                f"{' or '.join(table.names(SEQUENCE_CLASSIFICATION))}"
            )
        if forced == "torch":
            return "torch", dtype
        return forced, dtype or "int8"
    if quantize == "none" and onnx_int8_fits(device, dtype):
        return "onnx", "int8"
    return "torch", dtype


def resolve_embedder_backend(
    backend: str, device: str | None, dtype: str | None
) -> tuple[str, str | None]:
    """The (backend, dtype) of a bi-encoder, whose default is torch float32 (the exact scores).
    `auto` is the fastest runtime whose DL21 nDCG@10 stays within 0.003 of torch float32's
    (all-MiniLM-L6-v2 at depth 100, bench/RESULTS.md, "Bi-encoders on the runtime table"):

    - torch on a GPU, and wherever a torch type is named (bfloat16, float16);
    - the named runtime's own choice where a dtype is named (int8: onnx; float32: onnx where the
      `onnx` extra is installed, it embeds as torch float32 does to 1e-5 and faster);
    - on a CPU otherwise ONNX Runtime int8 where the extra is installed (0.31x torch float32's
      time, DL21 0.5801 against 0.5775, p = 0.61); torch float32 where it is not (bf16, 0.50x
      the time, moved an embedding with its batch company beyond DL21's tolerance).

    Other backends are taken as asked (the config has checked that they serve the task)."""
    if backend != AUTO:
        return backend, dtype
    if dtype == "int8":
        return "onnx", "int8"
    if _on_gpu(device) or dtype not in (None, AUTO, "float32", "fp32"):
        return "torch", dtype
    if _onnxruntime_installed():
        return "onnx", "float32" if dtype in ("float32", "fp32") else "int8"
    # Not bf16 on a CPU with native bf16: there an embedding moved with its batch company and
    # thread count by up to 0.0017 in a cosine, where DL21's top-10 neighbours are 0.0006 apart
    # at the 5th percentile (bench/bf16_invariance.py).
    if dtype in (None, AUTO):
        log.info("the onnx extra is not installed: the bi-encoder runs on torch float32")
    return "torch", dtype


def onnx_int8_fits(device: str | None, dtype: str | None) -> bool:
    """`auto`'s rule for ONNX Runtime int8, shared by the causal LM and the cross-encoder: a CPU
    (the engine's own device rule), no compute type asked for, onnxruntime installed."""
    return dtype in (None, AUTO) and not _on_gpu(device) and _onnxruntime_installed()


def _onnxruntime_installed() -> bool:
    """The `onnx` extra as `auto` needs it: ONNX Runtime to run the export, and `onnx` to make
    it (a model not exported yet failed with torch's bare `OnnxExporterError` without it)."""
    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))
