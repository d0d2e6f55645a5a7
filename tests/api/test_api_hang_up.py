"""A client that hangs up while its answer is generated, over a real uvicorn with the tiny CIS
reranker: the decoding loop stops at its next token, the request is counted as a client abort (499),
never as a 503 timeout, and the next request is served at once."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import httpx
import pytest
from api_fakes import config_for

from cisrank import testing
from cisrank.api.app import create_app
from cisrank.context.decoding import EnsembleDecoder

QUESTION = "when was the author of hamlet born ?"
STEP_S = 0.05


@pytest.fixture(scope="module")
def cis(tiny_gpt2_dir):
    from cisrank.rerank.cis import CISReranker

    return CISReranker(model=str(tiny_gpt2_dir), template="qa")


@pytest.fixture
def slow_steps(monkeypatch):
    """Every decoding step takes STEP_S and never picks the end of text (the tiny model's
    random weights could stop it early); returns the list of steps taken, as they happen."""
    steps: list[float] = []
    merge = EnsembleDecoder.merge

    def slow(self, decoding, step, fixed=None):
        time.sleep(STEP_S)
        merged, record = merge(self, decoding, step, fixed)
        eos = self.engine.tokenizer.eos_token_id
        if eos is not None:
            merged = merged.clone()
            merged[eos] = float("-inf")
        steps.append(time.monotonic())
        return merged, record

    monkeypatch.setattr(EnsembleDecoder, "merge", slow)
    return steps


def _metric(url: str, name: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {m[0]: float(m[1]) for m in re.findall(rf"^{name}\{{(.*)\}} (\S+)$", text, re.M)}


def _post_and_hang_up(url: str, body: dict, steps: list[float], after_steps: int) -> int:
    """POST `body` on a raw socket, close it once `after_steps` decoding steps ran; returns the
    steps taken at that moment."""
    host, port = url.removeprefix("http://").split(":")
    raw = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=10)
    head = (
        f"POST /v1/generate HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(raw)}\r\n\r\n"
    )
    sock.sendall(head.encode() + raw)
    deadline = time.monotonic() + 30
    while len(steps) < after_steps and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(steps) >= after_steps, "the generation did not start"
    sock.close()
    return len(steps)


@pytest.mark.parametrize("decoding", ["naive", "clehe"])
def test_a_client_that_hangs_up_stops_its_generation_at_the_next_step(
    cis, live_server, slow_steps, decoding
):
    app = create_app(config_for(["cis"]), rerankers={"cis": cis}, api_keys=[])
    url = live_server(app)
    docs = [{"text": s, "title": f"T{i}"} for i, s in enumerate(testing.SAMPLE_SENTENCES[:3])]
    body = {"query": QUESTION, "documents": docs, "decoding": decoding, "max_new_tokens": 200}
    at_close = _post_and_hang_up(url, body, slow_steps, after_steps=3)
    time.sleep(20 * STEP_S)  # long enough for 20 more steps if it went on
    after = len(slow_steps)
    assert after <= at_close + 2, f"{after - at_close} steps after the hang-up (of 200)"

    # counted as a client abort (499), not as a 503 timeout or any 5xx
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        aborts = _metric(url, "cisrank_client_aborts_total").get('route="/v1/generate"', 0.0)
        if aborts:
            break
        time.sleep(0.05)
    assert aborts == 1
    counts = _metric(url, "cisrank_requests_total")
    assert counts.get('route="/v1/generate",status="499"') == 1, counts
    assert not [k for k in counts if re.search(r'status="5\d\d"', k)], counts

    # the model thread is free: a small generation is served at once
    started = time.monotonic()
    small = {**body, "max_new_tokens": 2}
    r = httpx.post(f"{url}/v1/generate", json=small, timeout=30)
    assert r.status_code == 200 and len(r.json()["tokens"]) == 2, r.text
    assert time.monotonic() - started < 5


def test_the_decoder_stops_on_its_cancel_flag(cis):
    from cisrank.context import ContextAssembler
    from cisrank.context.decoding import DecodingCancelled
    from cisrank.data.types import Passage

    cancel = threading.Event()
    cancel.set()
    decoder = EnsembleDecoder(ContextAssembler(cis.engine))
    with pytest.raises(DecodingCancelled, match="after 0 tokens"):
        decoder.generate(QUESTION, [Passage("a", "text")], "leens", cancel=cancel)
