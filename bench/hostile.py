"""A hostile client against a real `cisrank serve`: the cases of the first hostile probe replayed,
then a fuzz of every route, reporting every 5xx, the server's memory and the worst latency a
well-behaved neighbour saw.

The server serves a CIS reranker (`--model`, SmolLM2 by default) and a dense one (`--dense-model`),
or with `--tiny` a tiny GPT-2 (byte-level BPE) and a tiny BERT built here in a minute, with its
soft descriptor limit lowered to `--descriptors` (so that a connection flood reaches the cap),
a head deadline of 5 s and `max_request_cost` `--max-request-cost` tokens (what the model does
within the request timeout on a CPU). A neighbour thread sends a small `/v1/rerank` and a
`/healthz` every 0.25 s throughout, except while a case overloads the server on purpose (the
burst and the flood, whose 503s are the point); a sampler reads the server's RSS every 50 ms.

The cases, each with the answer it must get (the probe's figure before in brackets):

- a 16.6 MB body of 3,850 runs of 4,300 digits and a 5,000-digit `top_n`: 400 after less than
  0.5 s of server CPU, the healthz probe never waiting 0.5 s more than it does idle [400 after
  74 s, healthz waited 74 s];
- a 128 MiB header: 431 or the connection closed, RSS within 64 MB [200, +344 MB for two];
  1,000 header lines: 431 [200];
- 1,000 connections that each send half a head: at most the cap held, every other one answered
  503 + Retry-After, the held ones 408 at the head deadline, then a fresh /healthz 200 and no
  "Too many open files" [descriptors exhausted, the load watch dead];
- `/v1/context` curvature over 4 documents of 200 characters from U+10000 up: 422 within 0.5 s
  of server CPU (English of the same length: 200) [503 after 60 s, the model thread held 58.8 s]; a context
  request whose client hangs up: the next small request answered within one slice plus its own
  time [503: the model thread stayed busy]; a 1,000-character query from U+10000 up: 422
  [21.6 s, +527 MB];
- `/v1/embeddings` of 100 texts of 2,000 characters with `dimensions: 128`: 422 within 0.5 s of
  server CPU [after 11.2 s of embedding]; 1,000 such texts: 422 [503 at 60 s];
- `max_tokens_per_doc: 1` over 480 documents of 32,000 characters: 200 within 2 s of server CPU,
  and a 2-document request sent 0.3 s later answered (its wait reported) [it waited 6.1 s behind
  one 8.9 s model-thread call];
- a 15 MB body nested 63 deep with a lone surrogate at the bottom: 422 within 0.5 s of server
  CPU, healthz free as above [3.9 s];
- 24 concurrent 15 MB bodies sent chunked, then 24 with Content-Length: at least as many chunked
  served as sized, every other one 503 + Retry-After [chunked: 0 of 24 served].

Then `--fuzz` requests (2,000) at concurrency 8 over every route, with non-ASCII text of every
kind (CJK, emoji and ZWJ sequences, U+10000 up, right-to-left, combining marks, zero-width and
noncharacters), huge strings, nesting up to 80 deep, wrong types, lone surrogates, long integers,
NaN, unknown fields, broken UTF-8 and JSON, and other content types. The bar: no 5xx at all.

    .venv/bin/python bench/hostile.py --tiny               # a few minutes on 2 quiet cores

Time bounds are on the server's CPU seconds, read from /proc (a shared host's scheduler inflates
wall-clock figures many times: here, under a load of 10, a request of 0.2 s of server CPU took
2.5-7 s); wall-clock seconds are reported beside them.
    CISRANK_DATA_DIR=../shared/data HF_HUB_OFFLINE=1 .venv/bin/python bench/hostile.py

`--holes` runs instead the second probe's holes 1, 2, 4 and 5 against a real
`cisrank serve --workers 2` with API keys on and a weightless reranker (tests/api/api_fakes), in
about a minute: 17 sockets without a key that each declare a 16 MB body, while 20 clients with the
key send 1 MB bodies (none may be refused); 32 clients that ask for a 4 MB answer and never read it
(peak RSS within the documented bound, every held one cut at the send timeout); 400 pipelined heads
in one write (all answered) and a client hanging up mid pipelined answer (no ERROR in the log); then
`kill -9` of the parent (no worker left, the port free).

    .venv/bin/python bench/hostile.py --holes
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from body_checks import nested_surrogate
from common import add_tag_option, result_name, write_result

HERE = Path(__file__).resolve().parent
QUESTION = "When was the author of Hamlet born?"
SENTENCES = [
    "William Shakespeare wrote Hamlet.",
    "Shakespeare was born in 1564 in Stratford-upon-Avon.",
    "Hamlet is a tragedy set in Denmark.",
    "Paris is the capital of France.",
]


# ------------------------------------------------------------------------------ the server


def tiny_models(folder: Path) -> tuple[str, str]:
    """A tiny GPT-2 with a byte-level BPE tokenizer and a tiny BERT, as the tests build them."""
    from cisrank import testing

    tokenizer = testing.bpe_tokenizer(testing.SAMPLE_SENTENCES * 3, vocab_size=320)
    lm = testing.build_causal_lm(folder / "gpt2", tokenizer, "gpt2")
    bert = testing.build_bert(folder / "bert", testing.words(testing.SAMPLE_SENTENCES))
    return str(lm), str(bert)


class Server:
    """`cisrank serve --config` in a process of its own, with a lowered descriptor limit."""

    def __init__(self, config: dict[str, Any], folder: Path, descriptors: int) -> None:
        path = folder / "server.json"
        path.write_text(json.dumps(config), encoding="utf-8")
        env = dict(os.environ, CISRANK_LOG_LEVEL="WARNING", TOKENIZERS_PARALLELISM="false")
        env.pop("CISRANK_API_KEYS", None)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]

        def lower() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, hard))

        cmd = [sys.executable, "-m", "cisrank.cli", "serve", "--config", str(path), "--port", "0"]
        self.err_path = folder / "server.err"
        self.err = self.err_path.open("w+", encoding="utf-8")
        self.proc = subprocess.Popen(
            cmd, env=env, stderr=self.err, stdout=subprocess.DEVNULL, preexec_fn=lower
        )
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            text = self.err_path.read_text(encoding="utf-8")
            ready = [ln for ln in text.splitlines() if ln.startswith("ready on ")]
            if ready:
                self.url = ready[0].split()[-1]
                self.port = int(self.url.rsplit(":", 1)[1])
                return
            if self.proc.poll() is not None:
                raise SystemExit(f"cisrank serve exited {self.proc.returncode}:\n{text[-3000:]}")
            time.sleep(0.2)
        raise SystemExit("cisrank serve did not get ready in 600 s")

    def cpu_s(self) -> float:
        """CPU seconds the server process has used (user + system, its threads included)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> tuple[float, float]:
        """(VmRSS, VmHWM) in MB."""
        values = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(value.split()[0]) / 1024
        return values["VmRSS"], values["VmHWM"]

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.err.close()
        return code, self.err_path.read_text(encoding="utf-8")


class Neighbour(threading.Thread):
    """A well-behaved client: a small rerank and a healthz every 0.25 s; its worst latencies
    and any 5xx (while not paused)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True, name="neighbour")
        self.url = url
        self.stop_event = threading.Event()
        self.paused = threading.Event()
        self.worst = {"rerank": 0.0, "healthz": 0.0}
        self.statuses: Counter[str] = Counter()
        self.samples: list[float] = []

    def run(self) -> None:
        body = {"query": QUESTION, "documents": SENTENCES[:2]}
        with httpx.Client(timeout=120) as client:
            while not self.stop_event.wait(0.25):
                if self.paused.is_set():
                    continue
                for route in ("healthz", "rerank"):
                    started = time.perf_counter()
                    try:
                        if route == "healthz":
                            r = client.get(self.url + "/healthz")
                        else:
                            r = client.post(self.url + "/v1/rerank", json=body)
                        key = str(r.status_code)
                    except httpx.HTTPError as exc:
                        key = type(exc).__name__
                    seconds = time.perf_counter() - started
                    if not self.paused.is_set():
                        self.statuses[key] += 1
                        self.worst[route] = max(self.worst[route], seconds)
                        if route == "rerank":
                            self.samples.append(seconds)


class Sampler(threading.Thread):
    """The server's RSS every 50 ms: its peak within a window (`since`)."""

    def __init__(self, server: Server) -> None:
        super().__init__(daemon=True, name="rss")
        self.server = server
        self.stop_event = threading.Event()
        self.points: list[tuple[float, float]] = []

    def run(self) -> None:
        while not self.stop_event.wait(0.05):
            with contextlib.suppress(OSError, KeyError):
                self.points.append((time.monotonic(), self.server.rss_mb()[0]))

    def peak_since(self, t: float) -> float:
        return max((rss for at, rss in self.points if at >= t), default=0.0)


# ------------------------------------------------------------------------------ raw HTTP


def raw_exchange(
    port: int,
    head: bytes,
    body_parts: Sequence[bytes] = (),
    timeout: float = 60,
    pace_s: float = 0.0,
) -> tuple[int | None, dict[str, str], bytes]:
    """Send `head` and `body_parts` (`pace_s` apart) on a fresh connection; (status or None,
    headers, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(head)
            for part in body_parts:
                sock.sendall(part)
                if pace_s:
                    time.sleep(pace_s)
        data = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(1 << 16):
                data += chunk
    head_part, _, rest = data.partition(b"\r\n\r\n")
    lines = head_part.decode("latin-1").split("\r\n")
    if not lines[0].startswith("HTTP/1.1 "):
        return None, {}, data
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, rest


def post_head(path: str, extra: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\n{extra}\r\n"
    ).encode()


def timed_post(url: str, path: str, body: Any, **kwargs: Any) -> tuple[int, float, str]:
    started = time.perf_counter()
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    r = httpx.post(url + path, content=content, headers=headers, timeout=300, **kwargs)
    return r.status_code, time.perf_counter() - started, r.text[:300]


class HealthProbe:
    """/healthz every 20 ms while a block runs: the worst wait."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=300) as client:
            while not self._stop.wait(0.02):
                started = time.perf_counter()
                with contextlib.suppress(httpx.HTTPError):
                    client.get(self.url + "/healthz")
                self.worst = max(self.worst, time.perf_counter() - started)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(310)


# ------------------------------------------------------------------------------ the cases


def astral(n: int, rng: random.Random) -> str:
    return "".join(chr(rng.randrange(0x10000, 0x10FFF)) for _ in range(n))


def english(n: int, rng: random.Random) -> str:
    out = ""
    while len(out) < n:
        out += rng.choice(SENTENCES) + " "
    return out[:n]


def healthz_baseline(url: str, seconds: float = 2.0) -> float:
    """The worst /healthz wait over `seconds` with nothing heavy in flight: on a shared host the
    scheduler, not the server, sets the floor of every wall-clock figure."""
    with HealthProbe(url) as probe:
        time.sleep(seconds)
    return probe.worst


def run_cases(server: Server, neighbour: Neighbour, sampler: Sampler, args: Any) -> list[dict]:
    """Each case's answer and figures. Where a case bounds time, the bound is on the server's CPU
    seconds (the work it did before answering: what the fixes bound, and what a loaded host does not
    inflate); wall-clock seconds are reported beside them. The healthz probe's worst wait is judged
    against its worst with nothing in flight (`healthz_baseline`)."""
    url, port = server.url, server.port
    rng = random.Random(48)
    cases: list[dict] = []
    floor = healthz_baseline(url)
    print(f"healthz worst wait with nothing in flight: {floor:.3f} s", flush=True)

    def case(name: str, ok: bool, **figures: Any) -> None:
        cases.append({"case": name, "ok": ok, **figures})
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {figures}", flush=True)

    def cpu_of(fn: Any, *a: Any, **k: Any) -> tuple[Any, float]:
        before = server.cpu_s()
        result = fn(*a, **k)
        return result, server.cpu_s() - before

    def free(worst: float) -> bool:
        """The event loop stayed free: healthz waited at most 0.5 s more than it does idle."""
        return worst < floor + 0.5

    # finding 1: long integers in a large body
    runs = b",".join([b"1" * 4300] * 3850)
    body = b'{"query": "q", "documents": ["a"], "x": [' + runs + b'], "top_n": '
    body += b"7" * 5000 + b"}"
    with HealthProbe(url) as probe:
        (status, seconds, _), cpu = cpu_of(timed_post, url, "/v1/rerank", body)
    case(
        "long integer in 16.6 MB",
        status == 400 and cpu < 0.5 and free(probe.worst),
        status=status,
        server_cpu_s=round(cpu, 3),
        seconds=round(seconds, 3),
        healthz_worst_s=round(probe.worst, 3),
        mb=round(len(body) / 1e6, 1),
    )

    # finding 2: headers
    before = server.rss_mb()[0]
    started = time.monotonic()
    chunk = b"a" * (1 << 20)
    status_h, _, _ = raw_exchange(
        port,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ",
        [chunk] * args.header_mib + [b"\r\n\r\n"],
    )
    time.sleep(0.3)
    grew = sampler.peak_since(started) - before
    case(
        f"{args.header_mib} MiB header",
        status_h in (431, None) and grew < 64,
        status=status_h,
        rss_growth_mb=round(grew, 1),
    )
    lines = b"".join(b"X-%d: v\r\n" % i for i in range(1000))
    status_l, _, _ = raw_exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + lines + b"\r\n")
    case("1,000 header lines", status_l == 431, status=status_l)

    neighbour.paused.set()
    held: list[socket.socket] = []
    refused = 0
    failed: Counter[str] = Counter()
    flood_started = time.monotonic()
    for _ in range(args.flood):
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        except OSError as exc:  # refused before a byte was sent: counted, not held
            failed[type(exc).__name__] += 1
            continue
        held.append(sock)
    flood_s = time.monotonic() - flood_started
    # every connection is answered: 503 at once over the cap, 408 at the head deadline within
    flood_answers: Counter[int | None] = Counter()
    deadline = time.monotonic() + args.header_timeout + 10
    for sock in held:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            data = sock.recv(1 << 16)
        except OSError:
            data = b""
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None
        if status == 503 and b"retry-after:" not in data.lower():
            status = -503  # refused without saying when to retry
        flood_answers[status] += 1
    refused, timed_out = flood_answers[503], flood_answers[408]
    for sock in held:
        sock.close()
    time.sleep(0.5)
    fresh = httpx.get(url + "/healthz", timeout=10).status_code
    neighbour.paused.clear()
    cap = args.descriptors - max(64, min(2048, args.descriptors // 8)) - 128
    case(
        f"{args.flood} half-sent heads",
        refused + timed_out >= len(held) - 5 and 0 < timed_out <= cap and fresh == 200,
        connected=len(held),
        held_then_408=timed_out,
        refused_503=refused,
        other={str(k): v for k, v in flood_answers.items() if k not in (503, 408)},
        connect_failed=dict(failed),
        connect_s=round(flood_s, 2),
        cap=cap,
        fresh_healthz=fresh,
    )

    # finding 3: costs in tokens
    docs_en = [english(200, rng) for _ in range(4)]
    docs_astral = [astral(200, rng) for _ in range(4)]
    status_en, seconds_en, _ = timed_post(
        url, "/v1/context", {"query": QUESTION, "documents": docs_en, "arrange": "curvature"}
    )
    (status_as, seconds_as, _), cpu_as = cpu_of(
        timed_post,
        url,
        "/v1/context",
        {"query": QUESTION, "documents": docs_astral, "arrange": "curvature"},
    )
    case(
        "context curvature, 4 x 200 chars from U+10000",
        status_as == 422 and cpu_as < 0.5 and status_en == 200,
        english=status_en,
        english_s=round(seconds_en, 2),
        status=status_as,
        server_cpu_s=round(cpu_as, 3),
        seconds=round(seconds_as, 3),
    )
    (status_q, seconds_q, _), cpu_q = cpu_of(
        timed_post, url, "/v1/rerank", {"query": astral(1000, rng), "documents": SENTENCES * 3}
    )
    case(
        "1,000-char query from U+10000",
        status_q == 422 and cpu_q < 0.5,
        status=status_q,
        server_cpu_s=round(cpu_q, 3),
        seconds=round(seconds_q, 3),
    )
    heavy = {
        "query": QUESTION,
        "documents": [english(args.hangup_chars, rng) for _ in range(4)],
        "arrange": "curvature",
    }
    data = json.dumps(heavy).encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(post_head("/v1/context", f"Content-Length: {len(data)}\r\n") + data)
        time.sleep(0.5)
    status_n, seconds_n, _ = timed_post(
        url, "/v1/rerank", {"query": QUESTION, "documents": SENTENCES[:2]}
    )
    case(
        "a small request after a context hang-up",
        status_n == 200 and seconds_n < 60,  # not left to time out behind the abandoned one
        status=status_n,
        seconds=round(seconds_n, 2),
    )

    # finding 4: limits before the work
    texts = [english(2000, rng) for _ in range(100)]
    (status_d, seconds_d, _), cpu_d = cpu_of(
        timed_post, url, "/v1/embeddings", {"input": texts, "dimensions": 128, "model": "dense"}
    )
    case(
        "embeddings: 100 x 2,000 chars, dimensions 128",
        status_d == 422 and cpu_d < 0.5,
        status=status_d,
        server_cpu_s=round(cpu_d, 3),
        seconds=round(seconds_d, 3),
    )
    (status_m, seconds_m, _), cpu_m = cpu_of(
        timed_post, url, "/v1/embeddings", {"input": texts * 10, "model": "dense"}
    )
    case(
        "embeddings: 1,000 x 2,000 chars",
        status_m == 422 and cpu_m < 1,
        status=status_m,
        server_cpu_s=round(cpu_m, 3),
        seconds=round(seconds_m, 3),
    )
    big = {
        "query": QUESTION,
        "documents": [english(32_000, rng) for _ in range(480)],
        "max_tokens_per_doc": 1,
    }
    results: dict[str, Any] = {}

    def truncation() -> None:
        results["big"] = timed_post(url, "/v1/rerank", big)

    before = server.cpu_s()
    thread = threading.Thread(target=truncation)
    thread.start()
    time.sleep(0.3)
    small = timed_post(url, "/v1/rerank", {"query": QUESTION, "documents": SENTENCES[:2]})
    thread.join()
    cpu_t = server.cpu_s() - before
    case(
        "max_tokens_per_doc 1 over 480 x 32,000 chars, and a small request behind it",
        results["big"][0] == 200 and small[0] == 200 and cpu_t < 2,
        status=results["big"][0],
        server_cpu_s=round(cpu_t, 3),
        seconds=round(results["big"][1], 2),
        small_status=small[0],
        small_s=round(small[1], 2),
    )
    nested = nested_surrogate(340_000)
    with HealthProbe(url) as probe:
        (status_s, seconds_s, _), cpu_s = cpu_of(timed_post, url, "/v1/rerank", nested)
    case(
        "lone surrogate under 63 levels of 15 MB",
        status_s == 422 and cpu_s < 0.5 and free(probe.worst),
        status=status_s,
        server_cpu_s=round(cpu_s, 3),
        seconds=round(seconds_s, 3),
        healthz_worst_s=round(probe.worst, 3),
        mb=round(len(nested) / 1e6, 1),
    )

    # finding 5: a burst of bodies, chunked and sized
    neighbour.paused.set()
    payload = json.dumps({"query": "word", "documents": ["word " * 6000] * 500}).encode()
    served: dict[str, int] = {}
    all_told = True
    for mode in ("chunked", "sized"):

        def one(_: int, mode: str = mode) -> tuple[int | None, dict]:
            pieces = [payload[i : i + 65536] for i in range(0, len(payload), 65536)]
            if mode == "chunked":
                head = post_head("/v1/rerank", "Transfer-Encoding: chunked\r\n")
                parts = [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces] + [b"0\r\n\r\n"]
            else:
                head = post_head("/v1/rerank", f"Content-Length: {len(payload)}\r\n")
                parts = pieces
            # 5 ms between pieces: the bodies arrive together, as over a network (unpaced over
            # loopback they arrive one after another and never compete for the budget)
            status, headers, _rest = raw_exchange(port, head, parts, timeout=600, pace_s=0.005)
            return status, headers

        with ThreadPoolExecutor(args.burst) as pool:
            answers = list(pool.map(one, range(args.burst)))
        # served: read and answered (a 422, its cost being over the budget), not refused
        served[mode] = sum(status not in (503, None) for status, _ in answers)
        all_told &= all(
            status not in (503, None) or (status == 503 and "retry-after" in headers)
            for status, headers in answers
        )
        time.sleep(1)
    neighbour.paused.clear()
    case(
        f"{args.burst} x {len(payload) / 1e6:.0f} MB bodies, chunked then sized",
        served["chunked"] >= served["sized"] and all_told,
        served_chunked=served["chunked"],
        served_sized=served["sized"],
        every_other_503_retry_after=all_told,
    )
    return cases


# ------------------------------------------------------------------------------ the fuzz

TEXTS = [
    "",
    " ",
    "\t\n",
    "hamlet",
    "中文检索增强生成",
    "😀👍🏽👨‍👩‍👧‍👦",
    "𐍈𐌰𐌹𐌼𐍃",
    "שלום עולם مرحبا",
    "e\u0301\u0301\u0301",
    "\u200b\u200d\u2060",
    "\ufffe\uffff",
    "\ufeffbom",
    "\x00\x01\x7f",
    "<script>alert(1)</script>",
    "{question}{documents}{0}{}",
    "%s%n%x",
]


def fuzz_text(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.05:
        return rng.choice(TEXTS) * rng.randrange(1000, 20_000)  # huge
    return "".join(rng.choice(TEXTS) for _ in range(rng.randrange(1, 6)))


def fuzz_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if roll < 0.3:
        return fuzz_text(rng)
    if roll < 0.4:
        return rng.choice([0, -1, 10**30, 1.5, True, None])
    if roll < 0.5 and depth < 80:
        return [fuzz_value(rng, depth + 1)]
    if roll < 0.6 and depth < 80:
        return {fuzz_text(rng)[:20]: fuzz_value(rng, depth + 1)}
    return fuzz_text(rng)[:200]


def nest(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = {"m": value}
    return value


def fuzz_request(rng: random.Random) -> tuple[str, str, bytes, str]:
    """(method, path, body, content type) of one hostile request."""
    docs = [fuzz_text(rng) or "x" for _ in range(rng.randrange(1, 5))]
    query = fuzz_text(rng) or "q"
    route = rng.choice(
        ["rerank", "v2", "tei", "embeddings", "context", "generate", "search", "get"]
    )
    body: Any
    if route in ("rerank", "v2"):
        body = {"query": query, "documents": docs, "top_n": rng.choice([1, 3, None])}
        if rng.random() < 0.3:
            body["documents"] = [{"text": d, "meta": nest(fuzz_value(rng), 3)} for d in docs]
        if rng.random() < 0.3:
            body["max_tokens_per_doc"] = rng.choice([1, 5, 0, -3])
        path = "/v1/rerank" if route == "rerank" else "/v2/rerank"
    elif route == "tei":
        body, path = {"query": query, "texts": docs, "raw_scores": rng.random() < 0.5}, "/rerank"
    elif route == "embeddings":
        body = {"input": docs if rng.random() < 0.7 else query, "model": "dense"}
        if rng.random() < 0.3:
            body["dimensions"] = rng.choice([1, 64, 10**9])
        path = "/v1/embeddings"
    elif route == "context":
        arrange = rng.choice(["ranked", "reverse", "edges", "curvature", "likelihood_select"])
        body = {"query": query, "documents": docs[:3], "arrange": arrange}
        if rng.random() < 0.2:
            body["template"] = rng.choice(["{documents}{question}", "{x}", "qa", fuzz_text(rng)])
        path = "/v1/context"
    elif route == "generate":
        decoding = rng.choice(["naive", "avg_ens", "leens", "clehe"])
        body = {"query": query, "documents": docs[:2], "max_new_tokens": 2, "decoding": decoding}
        path = "/v1/generate"
    elif route == "search":
        body, path = {"query": query, "top_n": rng.choice([1, 5, 10**6])}, "/v1/search"
    else:
        path = rng.choice(["/healthz", "/readyz", "/v1/models", "/metrics", "/nope", "/v1/rerank"])
        return "GET", path, b"", ""
    # mutations
    roll = rng.random()
    if roll < 0.08:
        body[rng.choice(list(body))] = fuzz_value(rng)  # a wrong type anywhere
    elif roll < 0.12:
        body["unknown_field"] = 1
    elif roll < 0.16:
        body = nest(body, rng.choice([60, 63, 64, 65, 80]))
    raw = json.dumps(body, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
    roll = rng.random()
    content_type = "application/json"
    if roll < 0.05:
        raw = raw.replace(b'"q', b'"\\ud800q', 1)  # a lone surrogate
    elif roll < 0.08:
        raw = raw[: rng.randrange(1, max(2, len(raw)))]  # truncated
    elif roll < 0.10:
        raw = raw.replace(b"1", b"1" + b"0" * 5000, 1)  # a long integer
    elif roll < 0.12:
        raw = raw.replace(b"1", b"NaN", 1)
    elif roll < 0.14:
        raw = b"\xff\xfe" + raw  # not UTF-8
    elif roll < 0.16:
        content_type = rng.choice(["text/plain", "application/json; charset=latin-1", ""])
    return "POST", path, raw, content_type


def run_fuzz(url: str, n: int, concurrency: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    requests = [fuzz_request(rng) for _ in range(n)]
    statuses: Counter[int | str] = Counter()
    errors: list[str] = []
    worst = 0.0

    def send(item: tuple[str, str, bytes, str]) -> None:
        nonlocal worst
        method, path, raw, content_type = item
        headers = {"content-type": content_type} if content_type else {}
        started = time.perf_counter()
        try:
            with httpx.Client(timeout=300) as client:
                r = client.request(method, url + path, content=raw or None, headers=headers)
            statuses[r.status_code] += 1
            if r.status_code >= 500:
                errors.append(f"{r.status_code} {method} {path}: {r.text[:200]}")
        except httpx.HTTPError as exc:
            statuses[type(exc).__name__] += 1
            errors.append(f"{type(exc).__name__} {method} {path}")
        worst = max(worst, time.perf_counter() - started)

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(send, requests))
    return {
        "requests": n,
        "seconds": round(time.perf_counter() - started, 1),
        "statuses": {str(k): v for k, v in sorted(statuses.items(), key=str)},
        "server_errors": len(errors),
        "first_errors": errors[:10],
        "worst_request_s": round(worst, 2),
    }


# ------------------------------------------------------------------------------ main


# ---------------------------------------------------------------------------- the second probe

KEY = "bench-hostile-key-0123456789"
FAKES = HERE.parent / "tests" / "api"


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        with contextlib.suppress(FileNotFoundError):
            for task in os.listdir(f"/proc/{parent}/task"):
                with contextlib.suppress(FileNotFoundError):
                    text = Path(f"/proc/{parent}/task/{task}/children").read_text()
                    for child in map(int, text.split()):
                        if child not in found:
                            found.add(child)
                            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _rss_mb(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
    return total


def _head(path: str, length: int, key: bool) -> bytes:
    auth = f"Authorization: Bearer {KEY}\r\n" if key else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _status_of(sock: socket.socket) -> int:
    sock.settimeout(10)
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return 0
        data += chunk
    return int(data.split(b" ", 2)[1])


def run_holes(args: Any) -> None:
    """The second probe's holes 1, 2, 4 and 5 at its loads (see the module doc)."""
    budget_mib = args.response_budget_mib
    config = {
        "rerankers": {"fake": {"kind": "api_fakes:slow_reranker", "options": {"delay": 0.0}}},
        "limits": {
            "max_request_cost": 10**8,
            "max_inflight_body_bytes": args.body_budget_mib * 1024 * 1024,
            "max_inflight_response_bytes": budget_mib * 1024 * 1024,
            "response_send_timeout_s": args.send_timeout,
        },
        "batching": {"max_inflight_cost": 10**9, "max_batch_tokens": 10**9, "max_slice_s": 600},
    }
    result: dict[str, Any] = {
        "workers": 2,
        "response_budget_mib": budget_mib,
        "body_budget_mib": args.body_budget_mib,
    }
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "server.json"
        cfg.write_text(json.dumps(config), encoding="utf-8")
        err_path = Path(tmp) / "server.err"
        env = dict(os.environ, CISRANK_LOG_LEVEL="WARNING", CISRANK_API_KEYS=KEY)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAKES), env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "cisrank.cli", "serve", "--config", str(cfg), "--port", "0"]
        with err_path.open("w") as err:
            proc = subprocess.Popen(
                [*cmd, "--workers", "2"], env=env, stderr=err, stdout=subprocess.DEVNULL
            )
        below: set[int] = set()
        try:
            deadline = time.monotonic() + 120
            while "ready on " not in err_path.read_text() and time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise SystemExit(err_path.read_text()[-3000:])
                time.sleep(0.2)
            url = err_path.read_text().split("ready on ", 1)[1].split()[0]
            port = int(url.rsplit(":", 1)[1])
            below = _descendants(proc.pid)
            auth = {"authorization": f"Bearer {KEY}"}

            # 1: no key, no budget
            attackers = []
            for _ in range(17):
                sock = socket.create_connection(("127.0.0.1", port))
                sock.sendall(_head("/v1/rerank", 16_000_000, key=False) + b'{"query": "' * 9)
                attackers.append(sock)
            attacker_statuses = Counter(_status_of(s) for s in attackers)
            body = json.dumps({"query": "word", "documents": ["word " * 200] * 1000}).encode()
            with ThreadPoolExecutor(4) as pool:
                statuses = list(
                    pool.map(
                        lambda _: (
                            httpx.post(
                                url + "/v1/rerank", content=body, headers=auth, timeout=60
                            ).status_code
                        ),
                        range(20),
                    )
                )
            for sock in attackers:
                sock.close()
            result["hole1"] = {
                "unauthenticated_answers": dict(attacker_statuses),
                "authorised_statuses": dict(Counter(statuses)),
                "authorised_refused": sum(s != 200 for s in statuses),
            }

            # 2: slow readers
            workers = [p for p in _descendants(proc.pid) if p != proc.pid]
            time.sleep(1)
            baseline = _rss_mb(workers)
            answer = json.dumps(
                {"query": "word", "documents": ["word " * 1600] * 750, "return_documents": True}
            ).encode()  # a 6 MB body, and an answer as large: more than socket buffers take
            readers = []
            for _ in range(32):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(("127.0.0.1", port))
                with contextlib.suppress(OSError):  # refused mid-upload by the body budget
                    sock.sendall(_head("/v1/rerank", len(answer), key=True) + answer)
                readers.append(sock)
            peak = baseline
            started = time.monotonic()
            while time.monotonic() - started < 6:
                peak = max(peak, _rss_mb(workers))
                time.sleep(0.05)
            answers: Counter[int] = Counter()
            for sock in readers:  # the first bytes of each answer: a 200 (held) or a 503
                with contextlib.suppress(OSError):
                    sock.settimeout(5)
                    head12 = sock.recv(12)
                    answers[int(head12[9:12]) if head12.startswith(b"HTTP/1.1 ") else 0] += 1
            time.sleep(args.send_timeout + 2)  # the held ones are cut by now
            cut = 0
            for sock in readers:
                sock.settimeout(10)
                got = 0
                with contextlib.suppress(OSError):
                    while chunk := sock.recv(1 << 20):
                        got += len(chunk)
                cut += got < len(answer) - 12
                sock.close()
            # per worker: the answers held (the response budget) and the parsed request bodies
            # behind them (about 4x the body budget)
            bound = 2 * (budget_mib + 4 * args.body_budget_mib)
            result["hole2"] = {
                "readers": 32,
                "answer_mb": round(len(answer) / 1e6, 1),
                "answers": dict(answers),
                "held_then_cut_or_refused": cut,
                "rss_baseline_mb": round(baseline, 1),
                "rss_peak_mb": round(peak, 1),
                "rss_peak_delta_mb": round(peak - baseline, 1),
                "documented_bound_delta_mb": bound,
                "within_bound": peak - baseline <= bound,
            }

            # 5: pipelining, and a hang-up mid pipelined answer
            head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 56 + b"\r\n\r\n"
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(head * 400)
                sock.settimeout(10)
                data = b""
                with contextlib.suppress(OSError):
                    while data.count(b"HTTP/1.1 ") < 400 and (chunk := sock.recv(65536)):
                        data += chunk
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.sendall((_head("/v1/rerank", len(answer), key=True) + answer) * 2)
            time.sleep(1.5)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            sock.close()
            time.sleep(1.5)
            log = err_path.read_text()
            result["hole5"] = {
                "pipelined": 400,
                "answered_200": data.count(b"HTTP/1.1 200 "),
                "answered_431": data.count(b"HTTP/1.1 431 "),
                "error_lines_in_log": sum(" ERROR " in ln for ln in log.splitlines()),
            }

            # 4: the parent killed
            below |= _descendants(proc.pid)
            proc.kill()
            proc.wait(10)
            killed = time.monotonic()
            while any(map(_alive, below)) and time.monotonic() - killed < 30:
                time.sleep(0.1)
            orphans = [p for p in below if _alive(p)]
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as serve binds
                try:
                    probe.bind(("127.0.0.1", port))
                    free = True
                except OSError:
                    free = False
            result["hole4"] = {
                "orphans": len(orphans),
                "seconds_until_none_left": round(time.monotonic() - killed, 1),
                "port_free": free,
            }
        finally:
            if proc.poll() is None:
                proc.kill()
            for pid in below | _descendants(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    passed = (
        result["hole1"]["authorised_refused"] == 0
        and result["hole1"]["unauthenticated_answers"] == {401: 17}
        and result["hole2"]["within_bound"]
        and result["hole2"]["answers"].get(200, 0) < 32
        and result["hole5"]["answered_200"] == 400
        and result["hole5"]["error_lines_in_log"] == 0
        and result["hole4"]["orphans"] == 0
        and result["hole4"]["port_free"]
    )
    result["passed"] = passed
    print(json.dumps(result, indent=2))
    write_result(result_name("hostile", "holes", args.tag), result)
    if not passed:
        raise SystemExit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dense-model", default="all-MiniLM-L6-v2")
    ap.add_argument("--tiny", action="store_true", help="tiny models built here, not real ones")
    ap.add_argument("--fuzz", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--descriptors", type=int, default=1024)
    ap.add_argument("--flood", type=int, default=1000, help="half-sent heads")
    ap.add_argument("--header-mib", type=int, default=128)
    ap.add_argument("--burst", type=int, default=24)
    ap.add_argument(
        "--header-timeout",
        type=float,
        default=5.0,
        help="the server's head deadline: longer than the flood takes to connect, or its first "
        "connections time out before the last arrive and the cap is never reached",
    )
    ap.add_argument("--max-request-cost", type=int, default=16_384)
    ap.add_argument("--max-slice-s", type=float, default=2.0)
    ap.add_argument("--hangup-chars", type=int, default=2000)
    ap.add_argument("--holes", action="store_true", help="the second probe's holes instead")
    ap.add_argument("--response-budget-mib", type=int, default=16)
    ap.add_argument("--body-budget-mib", type=int, default=48)
    ap.add_argument("--send-timeout", type=float, default=5.0)
    add_tag_option(ap)
    args = ap.parse_args()
    if args.holes:
        run_holes(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.tiny:
            lm, dense = tiny_models(folder)
            args.hangup_chars = min(args.hangup_chars, 400)  # its context is 1,024 positions
        else:
            lm, dense = args.model, args.dense_model
        config = {
            "rerankers": {
                "cis": {"kind": "cis", "model": lm, "options": {"template": "qa"}, "workers": 1},
                "dense": {"kind": "dense", "model": dense},
            },
            "limits": {
                "max_request_cost": args.max_request_cost,
                "header_timeout_s": args.header_timeout,
            },
            "batching": {
                "max_inflight_cost": max(args.max_request_cost * 8, 1 << 20),
                "max_slice_s": args.max_slice_s,
            },
        }
        server = Server(config, folder, args.descriptors)
        sampler = Sampler(server)
        sampler.start()
        neighbour = Neighbour(server.url)
        neighbour.start()
        rss_before = server.rss_mb()[0]
        try:
            cases = run_cases(server, neighbour, sampler, args)
            fuzz = run_fuzz(server.url, args.fuzz, args.concurrency, seed=48)
        finally:
            neighbour.stop_event.set()
            neighbour.join(130)
            sampler.stop_event.set()
            sampler.join(5)
            rss_after, rss_peak = server.rss_mb()
            code, stderr = server.stop()
    emfile = "Too many open files" in stderr or "out of system resource" in stderr
    died = "Exception in thread" in stderr or "Traceback" in stderr
    summary = {
        "models": {
            "cis": "tiny gpt2 (bpe)" if args.tiny else lm,
            "dense": "tiny bert" if args.tiny else dense,
        },
        "cases_ok": sum(c["ok"] for c in cases),
        "cases": len(cases),
        "fuzz": fuzz,
        "neighbour_statuses": dict(neighbour.statuses),
        "neighbour_worst_rerank_s": round(neighbour.worst["rerank"], 2),
        "neighbour_worst_healthz_s": round(neighbour.worst["healthz"], 2),
        "neighbour_p50_rerank_s": round(sorted(neighbour.samples)[len(neighbour.samples) // 2], 3)
        if neighbour.samples
        else None,
        "rss_before_mb": round(rss_before, 1),
        "rss_peak_mb": round(rss_peak, 1),
        "rss_after_mb": round(rss_after, 1),
        "exit_code": code,
        "emfile_in_log": emfile,
        "traceback_in_log": died,
        "case_results": cases,
    }
    neighbour_5xx = sum(v for k, v in neighbour.statuses.items() if k.startswith("5"))
    passed = (
        summary["cases_ok"] == len(cases)
        and fuzz["server_errors"] == 0
        and neighbour_5xx == 0
        and code == 0
        and not emfile
        and not died
    )
    summary["passed"] = passed
    print(json.dumps({k: v for k, v in summary.items() if k != "case_results"}, indent=2))
    write_result(result_name("hostile", "tiny" if args.tiny else "", args.tag), summary)
    if not passed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
