"""The dense reranker's passage cache as the server reports it: /metrics per served reranker."""

from __future__ import annotations

from cisrank.rerank.dense import DenseReranker
from cisrank.rerank.passage_cache import ENTRY_OVERHEAD

DOCS = ["hamlet is a tragedy", "paris is the capital of france", "shakespeare wrote hamlet"]


def _metric(text: str, name: str) -> float:
    """The value of the sample whose name-and-labels is exactly `name`."""
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        if key == name:
            return float(value)
    raise AssertionError(f"{name} not in metrics")


def test_metrics_show_the_passage_cache_after_two_requests(make_client, tiny_bert_dir):
    cached = DenseReranker(str(tiny_bert_dir), passage_cache_mb=1)
    off = DenseReranker(str(tiny_bert_dir), passage_cache_mb=0)
    client = make_client({"dense": cached, "off": off})
    for query in ("who wrote hamlet", "where is paris"):
        body = {"query": query, "documents": DOCS, "model": "dense"}
        assert client.post("/v1/rerank", json=body).status_code == 200
    text = client.get("/metrics").text
    label = '{reranker="dense"}'
    assert _metric(text, f"cisrank_passage_cache_hits_total{label}") == 3
    assert _metric(text, f"cisrank_passage_cache_misses_total{label}") == 3
    assert _metric(text, f"cisrank_passage_cache_evictions_total{label}") == 0
    assert _metric(text, f"cisrank_passage_cache_hit_rate{label}") == 0.5
    assert _metric(text, f"cisrank_passage_cache_entries{label}") == 3
    entry = cached.dimensions * 4 + ENTRY_OVERHEAD
    assert _metric(text, f"cisrank_passage_cache_bytes{label}") == 3 * entry
    assert _metric(text, f"cisrank_passage_cache_budget_bytes{label}") == 1 << 20
    assert 'cisrank_passage_cache_hits_total{reranker="off"}' not in text
