"""Load test of the REST API: a separate client process against a running `cisrank serve`.

Starts the server (dense reranker, all-MiniLM-L6-v2) on a free 127.0.0.1 port, then, in this
process, measures the same reranker's in-process throughput on the same requests (while the server
is idle), and finally drives the server with 100-passage DL19 requests at each concurrency for a
bounded time: throughput, p50/p99 latency, errors. The headline figure is the server's throughput
at concurrency 8 as a ratio of the in-process throughput (target >= 0.85, zero errors).

    CISRANK_DATA_DIR=../shared/data HF_HUB_OFFLINE=1 .venv/bin/python bench/load.py
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
from common import write_result


def dl19_requests(data_dir: Path, passages: int) -> list[tuple[str, list[str]]]:
    data = json.loads((data_dir / "candidates-bm25-top100.json").read_text(encoding="utf-8"))
    return [(e["query"], [h["content"] for h in e["hits"][:passages]]) for e in data]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int, tmp: Path, config: dict | None = None) -> subprocess.Popen:
    """`cisrank serve` with the dense reranker `model`, or with `config` (a server config)."""
    config = config or {
        "rerankers": {"dense": {"kind": "dense", "model": model}},
        "batching": {"max_queue": 512, "request_timeout_s": 600, "max_wait_ms": 5},
    }
    cfg = tmp / "server.json"
    cfg.write_text(json.dumps(config), encoding="utf-8")
    env = dict(os.environ, CISRANK_LOG_LEVEL="WARNING", TOKENIZERS_PARALLELISM="false")
    env.pop("CISRANK_API_KEYS", None)
    cmd = [sys.executable, "-m", "cisrank.cli", "serve", "--config", str(cfg)]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=sys.stderr)


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("server not ready in time")


def in_process(model: str, requests: list, duration: float) -> dict:
    from cisrank.rerank.registry import load_reranker

    reranker = load_reranker("dense", model)
    reranker.score(*requests[0])  # warm-up
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < duration:
        q, ps = requests[done % len(requests)]
        reranker.score(q, ps)
        done += 1
    elapsed = time.perf_counter() - started
    return {"requests": done, "seconds": elapsed, "rps": done / elapsed}


def drive(url: str, requests: list, concurrency: int, duration: float) -> dict:
    """`concurrency` closed-loop clients; no request starts after `duration` seconds."""
    latencies: list[float] = []
    errors: list[str] = []
    counter = iter(range(10**9))
    lock = threading.Lock()
    deadline = time.perf_counter() + duration

    def client() -> None:
        with httpx.Client(timeout=600) as http:
            while time.perf_counter() < deadline:
                with lock:
                    q, ps = requests[next(counter) % len(requests)]
                t0 = time.perf_counter()
                try:
                    r = http.post(url + "/v1/rerank", json={"query": q, "documents": ps})
                    ok = r.status_code == 200 and len(r.json()["results"]) == len(ps)
                    err = None if ok else f"HTTP {r.status_code}"
                except httpx.HTTPError as exc:
                    err = type(exc).__name__
                with lock:
                    if err:
                        errors.append(err)
                    else:
                        latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    lat = np.asarray(latencies) * 1000
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": len(errors),
        "seconds": elapsed,
        "rps": len(latencies) / elapsed,
        "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
        "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="all-MiniLM-L6-v2")
    ap.add_argument("--data-dir", type=Path, default=None, help="trec-dl19 folder")
    ap.add_argument("--passages", type=int, default=100)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds per measurement")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    data_dir = (
        args.data_dir or Path(os.environ.get("CISRANK_DATA_DIR", "../shared/data")) / "trec-dl19"
    )
    requests = dl19_requests(data_dir, args.passages)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_server(args.model, port, Path(tmp))
        try:
            wait_ready(url, proc)
            httpx.post(
                url + "/v1/rerank",
                json={"query": requests[0][0], "documents": requests[0][1]},
                timeout=600,
            )
            base = in_process(args.model, requests, args.duration)
            print(
                f"in-process: {base['rps']:.3f} requests/s ({base['requests']} in {base['seconds']:.1f} s)"
            )
            levels = []
            for c in (int(x) for x in args.concurrency.split(",")):
                res = drive(url, requests, c, args.duration)
                res["ratio_to_in_process"] = res["rps"] / base["rps"]
                levels.append(res)
                print(
                    f"concurrency {c:>3}: {res['rps']:.3f} req/s ({res['requests']} ok, "
                    f"{res['errors']} errors), p50 {res['p50_ms']:.0f} ms, p99 {res['p99_ms']:.0f} ms, "
                    f"{res['ratio_to_in_process']:.3f}x in-process"
                )
        finally:
            proc.terminate()
            proc.wait(60)
    out = {"model": args.model, "passages": args.passages, "in_process": base, "server": levels}
    at8 = next((lv for lv in levels if lv["concurrency"] == 8), None)
    if at8 is not None:
        verdict = "met" if at8["ratio_to_in_process"] >= 0.85 and at8["errors"] == 0 else "NOT met"
        print(
            f"concurrency 8 / in-process = {at8['ratio_to_in_process']:.3f} (target >= 0.85, 0 errors: {verdict})"
        )
    write_result("load", out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
