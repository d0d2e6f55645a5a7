"""Device and dtype choice: CUDA with bf16 (fp16 on older GPUs) when present, CPU float32 otherwise."""

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
