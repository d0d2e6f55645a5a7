"""Builders of small on-disk datasets in the layout of ../shared/data, shared by tests."""

import gzip
import json


def write_folder(root, hits_by_query, qrels="q1 Q0 d1 2\n", topics="q1\tfirst query\n", gz=False):
    root.mkdir(parents=True, exist_ok=True)
    data = [
        {"query": q, "hits": [dict(h, qid=qid) for h in hits]}
        for (qid, q), hits in hits_by_query.items()
    ]
    name = "candidates-bm25-top100.json" + (".gz" if gz else "")
    payload = json.dumps(data).encode()
    (root / name).write_bytes(gzip.compress(payload) if gz else payload)
    if qrels is not None:
        (root / "qrels.txt").write_text(qrels)
    if topics is not None:
        (root / "topics.tsv").write_text(topics)
    return root


def hit(docid, rank, score, text="text"):
    return {"docid": docid, "rank": rank, "score": score, "content": text}
