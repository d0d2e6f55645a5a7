"""The server's life cycle over the wire, against a real `cisrank serve` process: SIGTERM with
requests still in flight past `graceful_timeout_s`.

Every request in flight when the server stops gets an answer a client can act on: its result
(200) or the JSON error body with 503 and Retry-After, never uvicorn's bare text/plain 500 or a
reset connection; and the process exits 0 (a requested stop, done).
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time

import httpx
from serve_process import ServeProcess

IN_FLIGHT = 12


def _queue_depth(url: str, reranker: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    found = re.search(rf'^cisrank_queue_depth\{{reranker="{reranker}"\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_sigterm_past_the_grace_period_answers_every_in_flight_request_with_json(tmp_path):
    # One request per model call (2 passages each), 0.3 s a call, held at a gate until all of
    # them are queued: in a 1.5 s grace period at most 6 finish, the others are still queued when
    # uvicorn cancels them.
    gate = tmp_path / "gate"
    options = {"delay": 0.3, "gate": str(gate)}
    config = {
        "rerankers": {"slow": {"kind": "api_fakes:slow_reranker", "options": options}},
        "batching": {"max_batch_passages": 2, "max_wait_ms": 0, "retry_after_s": 7},
        "graceful_timeout_s": 1.5,
    }
    (tmp_path / "server.json").write_text(json.dumps(config), encoding="utf-8")
    server = ServeProcess("--config", str(tmp_path / "server.json"), log=tmp_path / "server.log")
    server.__enter__()  # stopped in the finally below, after the SIGTERM under test
    answers: list[httpx.Response | BaseException | None] = [None] * IN_FLIGHT

    def call(i: int) -> None:
        body = {"query": f"query {i}", "documents": [f"passage {i}", "query"]}
        try:
            answers[i] = httpx.post(server.url + "/v1/rerank", json=body, timeout=30)
        except BaseException as exc:  # a reset or closed connection is a failure of the test
            answers[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(IN_FLIGHT)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while _queue_depth(server.url, "slow") < IN_FLIGHT and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _queue_depth(server.url, "slow") == IN_FLIGHT, server.output()
        gate.touch()
        server.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        code = server.proc.wait(30)
        log = server.output()
    finally:
        server.stop()

    statuses = []
    for i, r in enumerate(answers):
        assert isinstance(r, httpx.Response), f"request {i}: {r!r}\n{log}"
        statuses.append(r.status_code)
        assert r.headers["content-type"] == "application/json", (i, r.status_code, r.text)
        if r.status_code == 200:
            assert len(r.json()["results"]) == 2
            continue
        assert r.status_code == 503, (i, r.status_code, r.text)
        assert r.headers["retry-after"] == "7"
        assert r.headers["connection"] == "close"
        body = r.json()
        assert body["error"] == "shutting_down"
        assert "shutting down" in body["message"] and body["fields"] == []
    assert statuses.count(503) >= IN_FLIGHT // 2, statuses  # the grace period was passed...
    assert statuses.count(200) >= 1, statuses  # ...after the ones it had time for finished
    assert code == 0, log
    assert "Internal Server Error" not in log and "Traceback" not in log, log
