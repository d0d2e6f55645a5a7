"""Helpers shared by the benchmark scripts: real DL19 inputs, timing, machine description."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cisrank.fileio import atomic_write_text

RESULTS_DIR = Path(__file__).resolve().parent / "results"


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


def cpu_model() -> str:
    """The CPU's marketing name (Linux /proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The vector and matrix extensions that decide which kernels run (AVX2, AVX-512, VNNI,
    BF16, AMX): hosts here vary, and a ratio means little without them."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                return sorted(
                    f for f in flags if f.startswith(("avx", "amx", "fma")) or "vnni" in f
                )
    except OSError:
        pass
    return []


def machine_info() -> dict[str, Any]:
    import torch

    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "cpu_flags": cpu_flags(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }


def write_result(name: str, payload: dict[str, Any], results_dir: Path | None = None) -> Path:
    """`bench/results/<name>.json`: the figures a script printed, with the machine and date,
    so bench/RESULTS.md's prose can be checked against numbers a program can read."""
    record = {
        "benchmark": name,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "results": payload,
    }
    path = (results_dir or RESULTS_DIR) / f"{name}.json"
    return atomic_write_text(path, json.dumps(record, indent=2, default=str) + "\n")


def add_tag_option(ap: Any) -> None:
    """`--tag`: a run on another host keeps its own record beside the committed one."""
    ap.add_argument("--tag", default="", help="appended to the result's name (another host, ...)")


def result_name(*parts: str) -> str:
    """A result's file name from its parts, the empty ones (an unset `--tag`) left out."""
    return "_".join(filter(None, parts))


def report(name: str, payload: dict[str, Any], results_dir: Path | None = None) -> Path:
    """Print each figure on its own line, then `write_result` them."""
    width = max(len(k) for k in payload)
    for key, value in payload.items():
        print(f"{key:>{width}}: {value}")
    return write_result(name, payload, results_dir)


def interleaved(
    rerankers: dict[str, tuple[Any, int]],
    dataset: Any,
    qids: list[str],
    depth: int,
    queries_per_call: int = 1,
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Seconds and scores of each reranker (with the torch thread count this process runs it
    on) over the same queries' first-stage top `depth`, `queries_per_call` queries to a
    `score_batch` call (`cisrank eval` gives 8), the order of the rerankers rotated call by call
    so that load from other processes hits every one alike."""
    from cisrank.jobs.pool import set_threads

    names = list(rerankers)
    seconds = dict.fromkeys(names, 0.0)
    scores: dict[str, list[float]] = {name: [] for name in names}
    for k, at in enumerate(range(0, len(qids), queries_per_call)):
        requests = [
            (dataset.topics[q], [h.text for h in dataset.candidates[q][:depth]])
            for q in qids[at : at + queries_per_call]
        ]
        for name in names[k % len(names) :] + names[: k % len(names)]:
            reranker, threads = rerankers[name]
            set_threads(threads)
            t = time.perf_counter()
            lists = reranker.score_batch(requests)
            seconds[name] += time.perf_counter() - t
            scores[name] += [v for values in lists for v in values]
    return seconds, scores


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


GPT2_VOCAB = 50257


def gpt2_124m(dataset, device, dtype):
    """A GPT-2 124M-shaped causal LM (random weights) with a word-level tokenizer built from the
    dataset's texts, padded to GPT-2's 50,257 entries: the CIS speed model of every benchmark
    (no GPT-2 weights are available offline; random weights cost the same arithmetic)."""
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config

    from cisrank import testing

    texts = [dataset.topics[q] for q in dataset.qids] + [
        h.text for q in dataset.qids for h in dataset.candidates[q]
    ]
    tokenizer = testing.word_level_tokenizer(testing.words(texts), vocab_size=GPT2_VOCAB)
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=GPT2_VOCAB,
        n_layer=12,
        n_embd=768,
        n_head=12,
        n_positions=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = AutoModelForCausalLM.from_config(config).to(device=device, dtype=dtype).eval()
    return model, tokenizer, config
