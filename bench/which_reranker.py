"""Which reranker to serve: every named reranker's DL19 and DL21 nDCG@10 (BM25 top 100) beside
its 100-passage `/v1/rerank` latency, all served at once and timed in one run.

For each reranker it runs (or reuses, where its `metrics.json` is already there) the evaluation
that gives its figures, with the defaults a user gets:

    student       cisrank eval DATASET --reranker student
    dense MiniLM  cisrank eval DATASET --reranker dense
    ... int8      cisrank eval DATASET --reranker dense --backend onnx --dtype int8
    dense mpnet   cisrank eval DATASET --reranker dense --model all-mpnet-base-v2
    CIS           cisrank eval DATASET --reranker cis
    hybrid        cisrank eval fuse DATASET --run cis=... --run dense=... (the default fusion; it
                  ranks as `--reranker hybrid` does, tests/rerank/test_hybrid.py)

then starts one `cisrank serve` per reranker with the quick-start flags the README shows, and
sends each the same DL19 requests (a query and its BM25 top 100), one request at a time, the
order of the servers rotated request by request so that load from elsewhere hits all alike.
Reports p50 latency and pairs/s per reranker, with the CPU flags (ratios depend on them).
With `--clients N`, each turn of a server is a burst of N requests sent at once by N clients
(the next N DL19 queries), so the p50 is a request's latency under N-fold concurrency and
pairs/s the server's throughput over its bursts.

    CISRANK_DATA_DIR=../shared/data HF_HUB_OFFLINE=1 .venv/bin/python bench/which_reranker.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from common import add_tag_option, dl19_dir, machine_info, result_name, write_result
from load import dl19_requests, free_port, wait_ready

DATASETS = ("trec-dl19", "trec-dl21")
DEFAULT_FUSE = "cis:0.3,dense:0.7"

RERANKERS: dict[str, list[str]] = {
    "student": ["--reranker", "student"],
    "dense MiniLM": ["--reranker", "dense"],
    "dense MiniLM int8": ["--reranker", "dense", "--backend", "onnx", "--dtype", "int8"],
    "dense mpnet": ["--reranker", "dense", "--model", "all-mpnet-base-v2"],
    "dense mpnet onnx": [
        *("--reranker", "dense", "--model", "all-mpnet-base-v2"),
        *("--backend", "onnx", "--dtype", "float32"),
    ],
    "dense mpnet int8": [
        *("--reranker", "dense", "--model", "all-mpnet-base-v2"),
        *("--backend", "onnx", "--dtype", "int8"),
    ],
    "CIS": ["--reranker", "cis"],
    "hybrid": ["--reranker", "hybrid"],
}
"""Each reranker's flags: the same for `cisrank eval` and `cisrank serve` (the served command)."""


def slug(name: str) -> str:
    return name.lower().replace(" ", "-")


def cisrank(*args: str) -> list[str]:
    return [sys.executable, "-m", "cisrank.cli", *args]


def evaluate(name: str, dataset: str, out: Path) -> Path:
    """The reranker's evaluation folder on `dataset`, run unless its metrics are there."""
    folder = out / f"{slug(name)}-{dataset}"
    if (folder / "metrics.json").is_file():
        return folder
    if name == "hybrid":
        cis, dense = evaluate("CIS", dataset, out), evaluate("dense MiniLM", dataset, out)
        cmd = cisrank(
            "eval", "fuse", dataset, "--run", f"cis={cis / 'run.trec'}",
            "--run", f"dense={dense / 'run.trec'}", "--fuse", DEFAULT_FUSE, "--fusion", "linear",
            "--output", str(folder),
        )  # fmt: skip
    else:
        cmd = cisrank("eval", dataset, *RERANKERS[name], "--quiet", "--output", str(folder))
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return folder


def ndcg10(folder: Path) -> float:
    metrics = json.loads((folder / "metrics.json").read_text())
    runs = metrics["runs"]
    # `eval` names its run "reranked"; `eval fuse` names the fused run after the fusion ("hybrid")
    # beside its inputs and the first stage, the first of which must not be read for it
    run = runs.get("reranked") or runs.get("hybrid")
    if run is None:
        raise SystemExit(f"{folder}/metrics.json has neither a reranked nor a hybrid run")
    return float(run["nDCG@10"])


def serve(flags: list[str], port: int) -> subprocess.Popen:
    env = dict(os.environ, CISRANK_LOG_LEVEL="WARNING", TOKENIZERS_PARALLELISM="false")
    env.pop("CISRANK_API_KEYS", None)
    cmd = cisrank("serve", *flags, "--host", "127.0.0.1", "--port", str(port))
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10, help="DL19 queries timed per reranker")
    ap.add_argument("--out", type=Path, default=Path("out/which"), help="evaluation folders")
    ap.add_argument("--only", action="append", help="rerankers to include (default: all)")
    ap.add_argument("--no-eval", action="store_true", help="latency only")
    ap.add_argument("--evals-only", action="store_true", help="the evaluations only (no server)")
    ap.add_argument("--clients", type=int, default=1, help="concurrent clients (bursts of N)")
    add_tag_option(ap)
    args = ap.parse_args()
    names = args.only or list(RERANKERS)
    figures: dict[str, dict[str, float]] = {}
    if not args.no_eval:
        for name in names:
            figures[name] = {d: ndcg10(evaluate(name, d, args.out)) for d in DATASETS}
    if args.evals_only:
        for name, by in figures.items():
            print(name, {d: round(v, 4) for d, v in by.items()})
        return
    every = dl19_requests(dl19_dir(), 100)
    requests = every[: args.requests]
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    seconds: dict[str, list[float]] = {n: [] for n in names}
    busy: dict[str, float] = dict.fromkeys(names, 0.0)  # wall seconds of each server's bursts
    clients = [httpx.Client(timeout=900) for _ in range(args.clients)]

    def post(k: int, url: str, query: str, passages: list[str]) -> float:
        started = time.perf_counter()
        r = clients[k].post(f"{url}/v1/rerank", json={"query": query, "documents": passages})
        r.raise_for_status()
        return time.perf_counter() - started

    try:
        for name in names:
            port = free_port()
            servers[name] = (serve(RERANKERS[name], port), f"http://127.0.0.1:{port}")
        for proc, url in servers.values():
            wait_ready(url, proc, timeout=900)
        with ThreadPoolExecutor(args.clients) as pool:
            for i in range(len(requests)):
                burst = [every[(i * args.clients + k) % len(every)] for k in range(args.clients)]
                order = names[i % len(names) :] + names[: i % len(names)]
                for name in order:
                    url = servers[name][1]
                    started = time.perf_counter()
                    futures = [pool.submit(post, k, url, q, p) for k, (q, p) in enumerate(burst)]
                    seconds[name] += [f.result() for f in futures]
                    busy[name] += time.perf_counter() - started
                print(f"turn {i + 1}/{len(requests)}", flush=True)
    finally:
        for client in clients:
            client.close()
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=120)
    rows = {}
    print(
        f"\n{len(requests)} turns of {args.clients} concurrent requests of 100 DL19 passages; "
        f"CPU flags {machine_info()['cpu_flags']}"
    )
    print("| reranker | DL19 nDCG@10 | DL21 nDCG@10 | p50 latency | pairs/s | served by |")
    print("|---|---|---|---|---|---|")
    for name in names:
        p50 = statistics.median(seconds[name])
        rows[name] = {
            **{f"{d}_nDCG@10": figures.get(name, {}).get(d) for d in DATASETS},
            "p50_s": p50,
            "pairs_per_s": 100 * len(seconds[name]) / busy[name],
            "clients": args.clients,
            "seconds": seconds[name],
            "command": "cisrank serve " + " ".join(RERANKERS[name]),
        }
        dl19, dl21 = (figures.get(name, {}).get(d) for d in DATASETS)
        fmt = lambda v: f"{v:.4f}" if v is not None else "-"  # noqa: E731
        print(
            f"| {name} | {fmt(dl19)} | {fmt(dl21)} | {p50:.2f} s | "
            f"{rows[name]['pairs_per_s']:.0f} | "
            f"`{rows[name]['command']}` |"
        )
    payload = {"requests": len(requests), "clients": args.clients, "rows": rows}
    write_result(result_name("which_reranker", args.tag), payload)


if __name__ == "__main__":
    main()
