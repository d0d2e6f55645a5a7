"""/v1/search on a real dense (FAISS + tiny BERT) index under concurrent requests.

Regression: every request's query encoding ran in its own worker thread through the index's one
sentence-transformers model at the same time. Its Hugging Face fast tokenizer must not be used
from two threads at once: a call that changes its truncation or padding settings while another
thread encodes fails with "RuntimeError: Already borrowed" (a 500). Whether a given transformers
version changes them on a call is its business, so the test checks the invariant that rules the
error out (the encoder is never entered by two threads at once) besides the answers.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from api_fakes import OverlapReranker, config_for

from cisrank import testing
from cisrank.api.app import create_app
from cisrank.indexes.build import build_index
from cisrank.indexes.kinds import open_index

WORDS = " ".join(testing.SAMPLE_SENTENCES).split()


@pytest.fixture(scope="module")
def dense_index(tmp_path_factory, tiny_bert_dir):
    tmp = tmp_path_factory.mktemp("dense-index")
    corpus = tmp / "corpus.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "text": t}) + "\n"
            for i, t in enumerate(testing.SAMPLE_SENTENCES)
        )
    )
    build_index("dense", corpus, tmp / "idx", {"model": str(tiny_bert_dir)}, progress=False)
    return tmp / "idx"


def _queries(n: int) -> list[str]:
    """Distinct queries of different lengths (the tokenizer pads and truncates each one)."""
    return [" ".join(WORDS[i % len(WORDS) :] + WORDS * (i % 4)) for i in range(n)]


class _OverlapProbe:
    """Wraps `encoder.encode`, counting how many threads are inside it at once; the short sleep
    keeps a call open long enough for a second thread to walk in if nothing stops it."""

    def __init__(self, encode) -> None:
        self.encode = encode
        self.inside = 0
        self.most = 0
        self.calls = 0
        self._count = threading.Lock()

    def __call__(self, *args, **kwargs):
        with self._count:
            self.inside += 1
            self.calls += 1
            self.most = max(self.most, self.inside)
        try:
            time.sleep(0.005)
            return self.encode(*args, **kwargs)
        finally:
            with self._count:
                self.inside -= 1


def test_concurrent_dense_searches_all_answer_like_sequential_ones(dense_index):
    queries = _queries(32)
    reference = open_index(dense_index)
    expected = [[(h.docid, h.score) for h in reference.search(q, 5)] for q in queries]
    retriever = open_index(dense_index)  # served cold: its tokenizer is first set up under load
    probe = _OverlapProbe(retriever.encoder.encoder.encode)  # the torch runtime's model
    retriever.encoder.encoder.encode = probe
    app = create_app(
        config_for(["ov"]), rerankers={"ov": OverlapReranker()}, retrievers={"dense": retriever}
    )

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await asyncio.gather(
                *(c.post("/v1/search", json={"query": q, "top_n": 5}) for q in queries)
            )

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * len(queries), [
        r.text for r in responses if r.status_code != 200
    ][:1]
    assert probe.calls == len(queries) and probe.most == 1
    for response, want in zip(responses, expected, strict=True):
        got = [(x["docid"], x["retrieval_score"]) for x in response.json()["results"]]
        assert [d for d, _ in got] == [d for d, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-6)
