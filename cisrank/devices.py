"""Device and dtype choice: CUDA with bf16 (fp16 on older GPUs) when present, CPU float32 otherwise.

Whether a CPU computes bf16 natively (`cpu_has_native_bf16`) is asked here too: where it does,
the rerankers' CPU default is bf16, as on a GPU (measured in bench/RESULTS.md)."""

from __future__ import annotations

import torch


def resolve_device(requested: str | torch.device | None = None) -> torch.device:
    if requested is not None and str(requested) != "auto":
        device = torch.device(requested)
        if device.type == "cuda" and not torch.cuda.is_available():
            from cisrank.errors import CisrankError

            raise CisrankError(f"device '{requested}' requested but CUDA is not available here")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def resolve_dtype(requested: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if requested is None or requested == "auto":
        return default_dtype(device)
    if isinstance(requested, torch.dtype):
        return requested
    names = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
        "float64": torch.float64,
    }
    try:
        return names[requested.lower()]
    except KeyError:
        from cisrank.errors import CisrankError

        raise CisrankError(f"unknown dtype '{requested}': use one of {sorted(names)}") from None


def _cpu_probe(name: str) -> bool:
    """A `torch.cpu._is_*_supported` probe (private API: absent or failing reads as False)."""
    probe = getattr(torch.cpu, name, None)
    try:
        return bool(probe()) if probe is not None else False
    except Exception:  # pragma: no cover - defensive
        return False


def cpu_has_native_bf16() -> bool:
    """bf16 matmuls in hardware (AVX512-BF16 or AMX), where bf16 ran 1.5x (the MiniLM student)
    to 1.9x (CIS) float32 on 2 AVX-512 cores; `CISRANK_CPU_BF16` overrides the detection."""
    from cisrank import env

    forced = env.cpu_bf16()
    if forced is not None:
        return forced
    return _cpu_probe("_is_avx512_bf16_supported") or _cpu_probe("_is_amx_tile_supported")


def cpu_has_vnni() -> bool:
    """int8 dot products that accumulate in int32 (AVX512-VNNI / AVX-VNNI): no saturation."""
    return _cpu_probe("_is_vnni_supported")
