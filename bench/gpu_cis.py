"""CIS on a GPU: bf16 and large batches against float32, on DL19.

Model: SmolLM2-135M-Instruct's architecture and tokenizer (its config.json and tokenizer files,
`--model-config`) with seeded random weights: the arithmetic and the token counts of the real
model, with no weights to carry to a lent GPU machine. Speed is what this measures; the scores
of random weights say nothing of nDCG, only how far bf16 moves a score.

Over DL19's BM25 top `--depth` of `--queries` queries, the reverse estimator (`upr`), each path
timed over every query after one warm-up query:

- float32, GPU batching (32,768 padded tokens a batch, padding bound 0.25: the engine's default
  on CUDA);
- float32, CPU batching (4,096 tokens, padding bound 0.05), to show what the large batches buy;
- bf16 (the engine's default on a GPU), GPU batching;
- a 48-pair sample scored in float32 by the CPU engine: the GPU float32 scores must agree to
  1e-3, as every backend must.

Reports pairs/s and tokens/s per path, the bf16 score difference (per token, and the per-query
Spearman of bf16 against float32), the CPU agreement, and the GPU's dense matmul peak.

    CISRANK_DATA_DIR=../shared/data python bench/gpu_cis.py --model-config <smollm2 folder>
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import dl19_dir, report
from scipy.stats import spearmanr

from cisrank.data.datasets import load_folder
from cisrank.rerank.cis import CISReranker

CPU_BATCHING = {"batch_tokens": 4096, "max_padding": 0.05}


def random_model(config_dir: Path, out: Path, seed: int = 0) -> Path:
    """The architecture of `config_dir` with seeded random weights, saved with its tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(config_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(config_dir).save_pretrained(out)
    return out


def matmul_tflops(dtype: torch.dtype, n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * 10 / (time.perf_counter() - t) / 1e12


def timed(reranker: CISReranker, requests: list[tuple[str, list[str]]]) -> tuple[float, list]:
    reranker.score_batch(requests[:1])  # warm-up: kernels, allocator
    torch.cuda.synchronize()
    t = time.perf_counter()
    scores = reranker.score_batch(requests)
    torch.cuda.synchronize()
    return time.perf_counter() - t, scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-config", type=Path, required=True)
    ap.add_argument("--queries", type=int, default=43)
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--cpu-sample", type=int, default=48)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu_cis.py needs a CUDA device")

    data = load_folder(dl19_dir())
    qids = [q for q in data.qrels if q in data.candidates][: args.queries]
    requests = [(data.topics[q], [h.text for h in data.candidates[q][: args.depth]]) for q in qids]
    pairs = sum(len(ps) for _, ps in requests)
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(random_model(args.model_config, Path(tmp) / "model"))
        common = {"estimator": "reverse", "reverse_template": "upr", "device": "cuda"}
        paths = {
            "float32, GPU batching": CISReranker(model=folder, dtype="float32", **common),
            "float32, CPU batching": CISReranker(
                model=folder, dtype="float32", **common, **CPU_BATCHING
            ),
            "bf16, GPU batching": CISReranker(model=folder, **common),
        }
        spans = paths["bf16, GPU batching"].reverse_spans(requests)  # the same ids on every path
        tokens = sum(len(context) + len(query) for context, query in spans)
        out: dict[str, object] = {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "queries": len(qids),
            "pairs": pairs,
            "tokens (context + query)": tokens,
            "model": "SmolLM2-135M-Instruct architecture, random weights (seed 0)",
            "default dtype on this GPU": str(
                next(paths["bf16, GPU batching"].engine.backend.model.parameters()).dtype
            ),
        }
        scores = {}
        for name, reranker in paths.items():
            seconds, scores[name] = timed(reranker, requests)
            out[f"{name}: pairs/s"] = round(pairs / seconds, 1)
            out[f"{name}: tokens/s"] = round(tokens / seconds)
        f32 = [np.array(s) for s in scores["float32, GPU batching"]]
        cpu_batching = [np.array(s) for s in scores["float32, CPU batching"]]
        bf16 = [np.array(s) for s in scores["bf16, GPU batching"]]
        lengths = [len(query) for _, query in spans]
        flat32, flat16 = np.concatenate(f32), np.concatenate(bf16)
        per_token = np.abs(flat16 - flat32) / np.array(lengths)
        out["float32 GPU vs CPU batching: max |diff|"] = float(
            np.abs(np.concatenate(cpu_batching) - flat32).max()
        )
        out["bf16 vs float32: mean |diff| per query token"] = round(float(per_token.mean()), 5)
        out["bf16 vs float32: max |diff| per query token"] = round(float(per_token.max()), 5)
        out["bf16 vs float32: mean per-query Spearman"] = round(
            float(np.mean([spearmanr(a, b).statistic for a, b in zip(f32, bf16, strict=True)])), 4
        )
        # the CPU engine on a sample: float32 on the GPU must be the same number to 1e-3
        sample = [(requests[0][0], requests[0][1][: args.cpu_sample])]
        cpu = CISReranker(model=folder, estimator="reverse", reverse_template="upr", device="cpu")
        want = np.array(cpu.score_batch(sample)[0])
        got = np.array(paths["float32, GPU batching"].score_batch(sample)[0])
        out["float32 GPU vs CPU engine: max |diff| (sample)"] = float(np.abs(got - want).max())
        out["GPU matmul peak bf16 TFLOP/s (8192^3)"] = round(matmul_tflops(torch.bfloat16), 1)
        out["GPU matmul peak float32 TFLOP/s (8192^3)"] = round(matmul_tflops(torch.float32), 1)
    report("gpu_cis", out)


if __name__ == "__main__":
    main()
