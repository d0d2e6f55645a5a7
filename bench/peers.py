"""cisrank against its peers on the same student weights: who ranks 100 passages fastest, at what
nDCG, under 8 concurrent clients.

Peers, each with its defaults, each given the very same model (the float32 weights cisrank widens
the shipped student to, or `--student FOLDER`):

- **cisrank** `/v1/rerank` of a `cisrank serve --reranker cross-encoder --model STUDENT` (the
  served default: ONNX Runtime int8 on a CPU with onnxruntime, batching across requests), over
  HTTP: the peers below run in-process and pay no HTTP, so the comparison favours them;
- **sentence-transformers** `CrossEncoder(STUDENT).rank(query, documents)` with its defaults
  (float32 torch, batch size 32), 8 threads calling one model;
- **FlashRank** (`flashrank.Ranker.rerank`) given a local model: cisrank's own int8 ONNX export
  of the student laid out as a FlashRank model folder (FlashRank runs one plain ONNX Runtime
  session over the whole list padded to its longest pair), 8 threads calling one ranker;
- **cisrank torch in-process** (`CrossEncoderReranker(backend="torch", dtype="float32")`) beside
  `CrossEncoder.rank` on one client: the torch path must not trail the peer's torch path.

Throughput: every peer gets the same burst of requests (DL19 queries, each with its BM25 top
100) from `--clients` threads at once, the peers taking turns burst by burst (rotated each
round) so that load from elsewhere hits all alike; pairs/s is pairs over the burst's wall time,
latency the p50 of its requests. nDCG@10: each peer ranks all 43 judged DL19 queries' top 100
once (one client). Records the CPU flags, which decide the int8 and bf16 kernels.

    CISRANK_DATA_DIR=../shared/data .venv/bin/python bench/peers.py [--student out/student]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from common import add_tag_option, dl19_dir, machine_info, result_name, write_result
from load import free_port, wait_ready

Rank = Callable[[str, Sequence[str]], list[int]]
"""A peer: (query, documents) -> document indexes, best first."""


def cisrank_http(url: str, client: httpx.Client) -> Rank:
    def rank(query: str, docs: Sequence[str]) -> list[int]:
        r = client.post(f"{url}/v1/rerank", json={"query": query, "documents": list(docs)})
        r.raise_for_status()
        return [x["index"] for x in r.json()["results"]]

    return rank


def st_peer(folder: str) -> Rank:
    import torch
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(folder, device="cpu", model_kwargs={"dtype": torch.float32})

    def rank(query: str, docs: Sequence[str]) -> list[int]:
        return [int(h["corpus_id"]) for h in model.rank(query, list(docs))]

    return rank


def flashrank_peer(onnx_folder: Path, tokenizer_folder: Path, workdir: Path) -> Rank:
    """FlashRank on a local model: its cache layout (`<cache>/<model name>/<file>`) holding
    cisrank's int8 export of the student and the student's tokenizer files."""
    from flashrank import Ranker, RerankRequest
    from flashrank.Config import model_file_map

    name = "ms-marco-MiniLM-L-12-v2"  # a name FlashRank knows, so it looks for a local folder
    model_dir = workdir / name
    model_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(onnx_folder / "model-int8.onnx", model_dir / model_file_map[name])
    for f in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copyfile(tokenizer_folder / f, model_dir / f)
    tok_config = json.loads((tokenizer_folder / "tokenizer_config.json").read_text())
    specials = {
        k: tok_config[k]
        for k in ("cls_token", "sep_token", "pad_token", "unk_token", "mask_token")
        if isinstance(tok_config.get(k), str)
    }
    (model_dir / "special_tokens_map.json").write_text(json.dumps(specials))
    config = json.loads((model_dir / "config.json").read_text())
    config.setdefault("pad_token_id", 0)
    (model_dir / "config.json").write_text(json.dumps(config))
    tok_config.setdefault("model_max_length", 512)
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tok_config))
    ranker = Ranker(model_name=name, cache_dir=str(workdir), log_level="WARNING")

    def rank(query: str, docs: Sequence[str]) -> list[int]:
        passages = [{"id": i, "text": d} for i, d in enumerate(docs)]
        return [int(p["id"]) for p in ranker.rerank(RerankRequest(query=query, passages=passages))]

    return rank


def cisrank_torch_peer(folder: str) -> Rank:
    from cisrank.rerank.registry import load_reranker

    reranker = load_reranker("cross-encoder", folder, backend="torch", dtype="float32")

    def rank(query: str, docs: Sequence[str]) -> list[int]:
        return [h.index for h in reranker.rank(query, list(docs))]

    return rank


def burst(rank: Rank, requests: list[tuple[str, list[str]]], clients: int) -> tuple[float, list]:
    """All requests from `clients` threads at once: (wall seconds, per-request seconds)."""

    def one(req: tuple[str, list[str]]) -> float:
        t = time.perf_counter()
        rank(*req)
        return time.perf_counter() - t

    with ThreadPoolExecutor(clients) as pool:
        started = time.perf_counter()
        each = list(pool.map(one, requests))
        return time.perf_counter() - started, each


def ndcg10(rank: Rank, dataset) -> float:
    from cisrank.data.runs import Run
    from cisrank.eval.metrics import evaluate

    scores = {}
    for qid in dataset.qids:
        hits = dataset.candidates[qid][:100]
        order = rank(dataset.topics[qid], [h.text for h in hits])
        scores[qid] = [(hits[i].docid, float(len(order) - r)) for r, i in enumerate(order)]
    return evaluate(Run.from_scores("peer", scores), dataset.qrels, ["nDCG@10"])["nDCG@10"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--student", default="cisrank-student", help="student folder or name")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=16, help="requests of 100 passages a burst")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-ndcg", action="store_true")
    add_tag_option(ap)
    args = ap.parse_args()

    from cisrank.data.datasets import load_named
    from cisrank.models.resolve import resolve_model
    from cisrank.runtimes.encoder_onnx import OnnxCrossEncoder

    dataset = load_named("trec-dl19", dl19_dir())
    requests = [
        (dataset.topics[q], [h.text for h in dataset.candidates[q][:100]])
        for q in dataset.qids[: args.requests]
    ]
    folder = resolve_model(args.student)
    export = OnnxCrossEncoder(folder, "int8", threads=os.cpu_count() or 1)
    work = Path(tempfile.mkdtemp(prefix="peers-"))
    port = free_port()
    env = dict(os.environ, CISRANK_LOG_LEVEL="WARNING", TOKENIZERS_PARALLELISM="false")
    env.pop("CISRANK_ENCODER_BACKEND", None)
    cmd = [sys.executable, "-m", "cisrank.cli", "serve", "--reranker", "cross-encoder"]
    cmd += ["--model", args.student, "--port", str(port)]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=sys.stderr)
    client = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=args.clients))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, server, timeout=600)
        peers: dict[str, Rank] = {
            "cisrank /v1/rerank (default: ONNX int8)": cisrank_http(url, client),
            "sentence-transformers CrossEncoder.rank": st_peer(folder),
            "FlashRank (plain ONNX Runtime session, int8)": flashrank_peer(
                export.folder, Path(folder), work
            ),
        }
        torch_pair = {
            "cisrank torch float32, in-process": cisrank_torch_peer(folder),
            "sentence-transformers CrossEncoder.rank": peers[
                "sentence-transformers CrossEncoder.rank"
            ],
        }
        for rank in peers.values():  # warm-up: sessions, caches, the server's first batch
            rank(*requests[0])
        names = list(peers)
        walls: dict[str, list[float]] = {n: [] for n in names}
        latencies: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                wall, each = burst(peers[name], requests, args.clients)
                walls[name].append(wall)
                latencies[name] += each
            print(f"round {r + 1}/{args.rounds}", flush=True)
        solo: dict[str, float] = dict.fromkeys(torch_pair, 0.0)
        for i, req in enumerate(requests):
            for name in list(torch_pair)[i % 2 :] + list(torch_pair)[: i % 2]:
                t = time.perf_counter()
                torch_pair[name](*req)
                solo[name] += time.perf_counter() - t
        ndcg = {} if args.no_ndcg else {n: ndcg10(peers[n], dataset) for n in names}
    finally:
        client.close()
        server.terminate()
        server.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)
    pairs = 100 * len(requests)
    rows = {
        n: {
            "pairs_per_s": pairs * len(walls[n]) / sum(walls[n]),
            "p50_latency_s": statistics.median(latencies[n]),
            "dl19_nDCG@10": ndcg.get(n),
        }
        for n in names
    }
    base = rows["sentence-transformers CrossEncoder.rank"]["pairs_per_s"]
    print(f"\n{args.clients} clients, bursts of {len(requests)} x 100 DL19 passages, "
          f"{args.rounds} rounds; CPU flags {machine_info()['cpu_flags']}")  # fmt: skip
    print("| peer | pairs/s | vs sentence-transformers | p50 latency | DL19 nDCG@10 |")
    print("|---|---|---|---|---|")
    for n, row in rows.items():
        nd = f"{row['dl19_nDCG@10']:.4f}" if row["dl19_nDCG@10"] is not None else "-"
        print(
            f"| {n} | {row['pairs_per_s']:.1f} | {row['pairs_per_s'] / base:.2f}x | "
            f"{row['p50_latency_s']:.2f} s | {nd} |"
        )
    torch_rates = {n: pairs / s for n, s in solo.items()}
    print("\nOne client, torch float32 on both sides:")
    for n, v in torch_rates.items():
        print(f"  {n}: {v:.1f} pairs/s")
    write_result(
        result_name("peers", args.tag),
        {
            "student": args.student,
            "clients": args.clients,
            "requests": len(requests),
            "rounds": args.rounds,
            "rows": rows,
            "torch_one_client_pairs_per_s": torch_rates,
        },
    )


if __name__ == "__main__":
    main()
