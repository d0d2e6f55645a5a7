"""Helpers shared by the benchmark scripts: real DL19 inputs, timing, machine description."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def dl19_dir() -> Path:
    root = os.environ.get("CISRANK_DATA_DIR") or str(
        Path(__file__).resolve().parents[2] / "shared" / "data"
    )
    path = Path(root) / "trec-dl19"
    if not path.is_dir():
        raise SystemExit(f"benchmark needs the DL19 data: set CISRANK_DATA_DIR (no {path})")
    return path


def machine() -> str:
    import torch

    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, python {platform.python_version()}"
    )


def time_calls(fn: Callable[[], object], repeats: int) -> list[float]:
    """Wall seconds of each call after one warm-up call."""
    fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def percentile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]
