"""A 100-passage `/v1/rerank` with the CIS reranker: one process of two torch threads (the
service before workers) against a worker per core (its default now), interleaved.

Starts two `cisrank serve` processes on free ports, the same CIS reranker (SmolLM2-135M-Instruct,
reverse estimator, UPR template) in each, one with `workers: 1, threads_per_worker: 2`, the
other with the default (one single-threaded worker per core). Then sends the same DL19
100-passage requests to both, alternating which goes first, one request at a time, and reports
the p50 (and every) latency of each, the ratio, and whether they ranked alike.

    CISRANK_DATA_DIR=../shared/data HF_HUB_OFFLINE=1 .venv/bin/python bench/serve_cis.py
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from common import dl19_dir, write_result
from load import dl19_requests, free_port, start_server, wait_ready

from cisrank.jobs.pool import cores


def config(model: str, workers: int | None, threads: int | None) -> dict:
    spec = {
        "kind": "cis",
        "model": model,
        "options": {"estimator": "reverse", "reverse_template": "upr"},
    }
    if workers is not None:
        spec["workers"] = workers
    if threads is not None:
        spec["threads_per_worker"] = threads
    return {
        "rerankers": {"cis": spec},
        "batching": {"request_timeout_s": 600},
        "limits": {"max_request_cost": 4 * 1024 * 1024},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--passages", type=int, default=100)
    args = ap.parse_args()
    requests = dl19_requests(dl19_dir(), args.passages)[: args.requests]
    setups = {
        "1 process x 2 threads (before)": config(args.model, 1, 2),
        f"{cores()} workers x 1 thread (default)": config(args.model, None, None),
    }
    servers = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for name, cfg in setups.items():
                port = free_port()
                folder = Path(tmp) / str(port)
                folder.mkdir()
                proc = start_server(args.model, port, folder, cfg)
                servers[name] = (proc, f"http://127.0.0.1:{port}")
            for proc, url in servers.values():
                wait_ready(url, proc, timeout=900)
            seconds: dict[str, list[float]] = {name: [] for name in servers}
            orders: dict[str, list[list[int]]] = {name: [] for name in servers}
            names = list(servers)
            with httpx.Client(timeout=900) as client:
                for i, (query, passages) in enumerate(requests):
                    for name in names if i % 2 == 0 else names[::-1]:
                        url = servers[name][1]
                        started = time.perf_counter()
                        r = client.post(
                            f"{url}/v1/rerank", json={"query": query, "documents": passages}
                        )
                        seconds[name].append(time.perf_counter() - started)
                        r.raise_for_status()
                        orders[name].append([x["index"] for x in r.json()["results"]])
                    print(f"request {i + 1}/{len(requests)}", flush=True)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(timeout=60)
    p50 = {name: statistics.median(v) for name, v in seconds.items()}
    before, after = names
    same = sum(a == b for a, b in zip(orders[before], orders[after], strict=True))
    print(f"\n{len(requests)} requests of {args.passages} DL19 passages, CIS reverse, {args.model}")
    for name in names:
        print(
            f"{name}: p50 {p50[name]:.2f} s  (all: {', '.join(f'{s:.2f}' for s in seconds[name])})"
        )
    print(
        f"speedup of the default: {p50[before] / p50[after]:.2f}x; same ranking in {same}/{len(requests)}"
    )
    write_result(
        "serve_cis",
        {
            "model": args.model,
            "requests": len(requests),
            "passages": args.passages,
            "p50_s": p50,
            "seconds": seconds,
            "speedup": p50[before] / p50[after],
            "same_ranking": same,
        },
    )


if __name__ == "__main__":
    main()
