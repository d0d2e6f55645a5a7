"""Server memory under many large concurrent bodies, with and without the in-flight bytes cap.

Before the cap, 64 concurrent 15 MB rerank bodies took a server from 0.69 to 4.23 GB. This starts
`cisrank serve` on a free 127.0.0.1 port with a stand-in reranker (the word-overlap fake of the API
tests, slowed to `--delay` s per model call: the bodies, not the model, are what is measured, and
the fake has no weights to download), fires `--bodies` concurrent rerank requests of `--mb` MB each
(500 documents of 30,000 characters for 15 MB), and reports the server's peak RSS (VmHWM), its RSS
before and after, and the status codes (to `bench/results/body_admission.json`, or
`body_admission_nocap.json`). Run it once per cap:

    .venv/bin/python bench/body_admission.py                # the default cap, 256 MiB
    .venv/bin/python bench/body_admission.py --cap 0        # no cap (2 GiB): the unbounded case
    .venv/bin/python bench/body_admission.py --chunked      # the same bodies sent chunked

With `--chunked` every body is sent without a Content-Length, in pieces of 64 KiB `--pace-ms`
apart, so that the bodies arrive together as over a network (64 concurrent chunked 15 MB bodies were
once 0 served, against 17 with Content-Length).

The per-request and in-flight cost budgets are raised for the run so that every admitted body
is really scored and held (the fake declares no tokenizer, so a 15 MB request costs its 15M
bytes; a real cross-encoder caps each pair at its max_length, 500 x 512 = 256k), and a request
is one model call.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
from common import write_result

HERE = Path(__file__).resolve().parent
FAKES = HERE.parent / "tests" / "api"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bodies", type=int, default=64)
    ap.add_argument("--mb", type=float, default=15.0, help="size of each body in MB (10^6 bytes)")
    ap.add_argument("--cap", type=int, default=256 * 1024 * 1024, help="0: no cap (2 GiB)")
    ap.add_argument("--delay", type=float, default=0.5, help="seconds per model call")
    ap.add_argument(
        "--chunked", action="store_true", help="send each body chunked (no Content-Length)"
    )
    ap.add_argument(
        "--pace-ms",
        type=float,
        default=5.0,
        help="pause between 64 KiB pieces of a chunked body (over loopback, unpaced bodies "
        "arrive one after another and never compete for the budget, as they do over a network)",
    )
    args = ap.parse_args()

    docs_per_body = 500
    chars = int(args.mb * 1e6 / docs_per_body) - 8
    body = json.dumps({"query": "word", "documents": ["word " * (chars // 5)] * docs_per_body})
    payload = body.encode()
    cap = args.cap or 2 * 1024**3
    config = {
        "rerankers": {
            "fake": {"kind": "api_fakes:slow_reranker", "options": {"delay": args.delay}}
        },
        "limits": {
            "max_documents": 1000,
            "max_document_chars": 32768,
            "max_body_bytes": max(len(payload) + 1, min(16 * 1024 * 1024, cap)),
            "max_inflight_body_bytes": cap,
            "max_request_cost": 10**8,
        },
        # one model call a request: the bodies are measured, not how the fake is sliced
        "batching": {
            "max_inflight_cost": 10**10,
            "request_timeout_s": 600,
            "max_queue": 512,
            "max_batch_tokens": 10**9,
            "max_slice_s": 600,
        },
    }
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "server.json"
        cfg.write_text(json.dumps(config), encoding="utf-8")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = dict(os.environ, CISRANK_LOG_LEVEL="WARNING", TOKENIZERS_PARALLELISM="false")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAKES), env.get("PYTHONPATH")]))
        env.pop("CISRANK_API_KEYS", None)
        cmd = [sys.executable, "-m", "cisrank.cli", "serve", "--config", str(cfg)]
        proc = subprocess.Popen([*cmd, "--host", "127.0.0.1", "--port", str(port)], env=env)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("server did not start")
                time.sleep(0.2)
            before = rss_kb(proc.pid)["VmRSS"]
            statuses: Counter[str] = Counter()
            lock = threading.Lock()
            go = threading.Barrier(args.bodies)

            def one() -> None:
                go.wait()
                try:

                    def pieces() -> Iterator[bytes]:
                        for i in range(0, len(payload), 65536):
                            yield payload[i : i + 65536]
                            time.sleep(args.pace_ms / 1000)

                    r = httpx.post(
                        url + "/v1/rerank",
                        content=pieces() if args.chunked else payload,
                        headers={"content-type": "application/json"},
                        timeout=600,
                    )
                    key = str(r.status_code)
                except httpx.HTTPError as exc:
                    key = type(exc).__name__
                with lock:
                    statuses[key] += 1

            started = time.perf_counter()
            threads = [threading.Thread(target=one) for _ in range(args.bodies)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            seconds = time.perf_counter() - started
            time.sleep(1.0)
            after = rss_kb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(60)
    result = {
        "bodies": args.bodies,
        "chunked": args.chunked,
        "pace_ms": args.pace_ms if args.chunked else None,
        "body_bytes": len(payload),
        "cap_bytes": cap,
        "rss_before_mb": round(before / 1024, 1),
        "rss_peak_mb": round(after["VmHWM"] / 1024, 1),
        "rss_after_mb": round(after["VmRSS"] / 1024, 1),
        "statuses": dict(statuses),
        "seconds": round(seconds, 1),
    }
    print(json.dumps(result, indent=2))
    name = "body_admission" if args.cap else "body_admission_nocap"
    write_result(name + ("_chunked" if args.chunked else ""), result)


if __name__ == "__main__":
    main()
