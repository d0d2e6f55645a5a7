"""Soak test of the REST API: mixed /v1/rerank and /v1/search traffic against a real `cisrank serve`.

Builds a BM25 index of the DL19 BM25 candidate passages in a temp folder, starts the server (dense
reranker, all-MiniLM-L6-v2, the index, every other setting at its default) on a free 127.0.0.1
port, and drives it with `--concurrency` closed-loop clients for `--seconds`: half of the requests
rerank a DL19 query's top `--passages` candidates, a quarter search the index (top 10), a quarter
search and rerank (depth `--passages`, top 10). Reports requests, errors (the target is 0), p50
and p99 latency (all and per kind), and the server process's resident memory: before the soak,
after it, and its peak (VmHWM). Exits 1 on any error, so `make bench` fails loudly.

    CISRANK_DATA_DIR=../shared/data HF_HUB_OFFLINE=1 .venv/bin/python bench/soak.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from common import RESULTS_DIR, write_result
from load import dl19_requests, free_port, start_server, wait_ready

KINDS = ("rerank", "rerank", "search", "search+rerank")


def rss_mb(pid: int, field: str = "VmRSS") -> float | None:
    """Resident memory of `pid` in MiB from /proc (VmRSS now, VmHWM its peak); None off Linux."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def build_bm25(data_dir: Path, out: Path) -> int:
    """A BM25 index of the unique DL19 candidate passages; returns how many."""
    from cisrank.indexes.build import build_index

    data = json.loads((data_dir / "candidates-bm25-top100.json").read_text(encoding="utf-8"))
    passages = {h["docid"]: h["content"] for e in data for h in e["hits"]}
    corpus = out.parent / "corpus.jsonl"
    with corpus.open("w", encoding="utf-8") as f:
        for docid, text in passages.items():
            f.write(json.dumps({"id": docid, "text": text}) + "\n")
    build_index("bm25", corpus, out, progress=False)
    return len(passages)


def call(http: httpx.Client, url: str, kind: str, query: str, docs: list[str]) -> str | None:
    """One request of `kind`; None when it got a complete 200, else what went wrong."""
    try:
        if kind == "rerank":
            r = http.post(url + "/v1/rerank", json={"query": query, "documents": docs})
            want = len(docs)
        else:
            body: dict[str, Any] = {"query": query, "top_n": 10}
            if kind == "search+rerank":
                body |= {"rerank": "dense", "depth": len(docs)}
            r = http.post(url + "/v1/search", json=body)
            want = 10
        if r.status_code != 200:
            return f"{kind}: HTTP {r.status_code}"
        if len(r.json()["results"]) != want:
            return f"{kind}: {len(r.json()['results'])} results, not {want}"
        return None
    except httpx.HTTPError as exc:
        return f"{kind}: {type(exc).__name__}"


def soak(url: str, requests: list, concurrency: int, seconds: float, pid: int) -> dict:
    """`concurrency` closed-loop clients for `seconds`, sampling the server's RSS meanwhile."""
    latencies: dict[str, list[float]] = {k: [] for k in set(KINDS)}
    errors: Counter[str] = Counter()
    counter = iter(range(10**9))
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds
    samples: list[float] = []
    done = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=600) as http:
            while time.perf_counter() < deadline:
                with lock:
                    n = next(counter)
                kind = KINDS[n % len(KINDS)]
                query, docs = requests[(n // len(KINDS)) % len(requests)]
                t0 = time.perf_counter()
                err = call(http, url, kind, query, docs)
                with lock:
                    if err:
                        errors[err] += 1
                    else:
                        latencies[kind].append(time.perf_counter() - t0)

    def sample() -> None:
        while not done.wait(0.5):
            if (mb := rss_mb(pid)) is not None:
                samples.append(mb)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    done.set()
    sampler.join()

    def summary(values: list[float]) -> dict[str, Any]:
        ms = np.asarray(values) * 1000
        return {
            "requests": len(values),
            "p50_ms": float(np.percentile(ms, 50)) if len(ms) else None,
            "p99_ms": float(np.percentile(ms, 99)) if len(ms) else None,
        }

    every = [x for values in latencies.values() for x in values]
    return {
        "concurrency": concurrency,
        "seconds": elapsed,
        **summary(every),
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "rps": len(every) / elapsed,
        "by_kind": {k: summary(v) for k, v in sorted(latencies.items())},
        "rss_max_sampled_mb": max(samples) if samples else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="all-MiniLM-L6-v2", help="dense reranker model")
    ap.add_argument("--data-dir", type=Path, default=None, help="trec-dl19 folder")
    ap.add_argument("--seconds", type=float, default=60.0, help="length of the soak")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--passages", type=int, default=20, help="passages per rerank (and depth)")
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where soak.json goes")
    args = ap.parse_args(argv)
    data_dir = (
        args.data_dir or Path(os.environ.get("CISRANK_DATA_DIR", "../shared/data")) / "trec-dl19"
    )
    requests = dl19_requests(data_dir, args.passages)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        index = Path(tmp) / "dl19-bm25"
        t0 = time.perf_counter()
        n_passages = build_bm25(data_dir, index)
        print(f"BM25 index of {n_passages} DL19 passages in {time.perf_counter() - t0:.1f} s")
        config = {
            "rerankers": {"dense": {"kind": "dense", "model": args.model}},
            "indexes": {"dl19": {"path": str(index)}},
        }
        proc = start_server(args.model, port, Path(tmp), config)
        try:
            wait_ready(url, proc)
            with httpx.Client(timeout=600) as http:  # warm-up: one request of each kind
                for kind in sorted(set(KINDS)):
                    if err := call(http, url, kind, *requests[0]):
                        raise SystemExit(f"warm-up failed: {err}")
            rss_before = rss_mb(proc.pid)
            load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
            res = soak(url, requests, args.concurrency, args.seconds, proc.pid)
            res |= {
                # other work on the machine slows the model: errors under load are timeouts
                "load_average_1min": [load_before, os.getloadavg()[0] if load_before else None],
                "rss_before_mb": rss_before,
                "rss_after_mb": rss_mb(proc.pid),
                "peak_rss_mb": rss_mb(proc.pid, "VmHWM"),
            }
        finally:
            proc.terminate()
            code = proc.wait(120)
    out = {
        "model": args.model,
        "passages": args.passages,
        "index_passages": n_passages,
        "mix": "1/2 rerank, 1/4 search (BM25 top 10), 1/4 search + rerank",
        "server_exit_code": code,
        **res,
    }
    print(
        f"soak {res['seconds']:.0f} s at concurrency {res['concurrency']}: {res['requests']} ok, "
        f"{res['errors']} errors, {res['rps']:.2f} req/s, p50 {res['p50_ms']:.0f} ms, "
        f"p99 {res['p99_ms']:.0f} ms; server RSS {res['rss_before_mb']:.0f} MiB before, "
        f"{res['rss_after_mb']:.0f} MiB after, peak {res['peak_rss_mb']:.0f} MiB; "
        f"exit code {code}"
    )
    for kind, s in res["by_kind"].items():
        print(
            f"  {kind:>14}: {s['requests']} ok, p50 {s['p50_ms']:.0f} ms, p99 {s['p99_ms']:.0f} ms"
        )
    if res["errors"]:
        print(f"errors: {res['error_kinds']}", file=sys.stderr)
    write_result("soak", out, args.results_dir)
    return 1 if res["errors"] or code != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
