"""Builders of small on-disk datasets in the layout of ../shared/data, shared by tests, and an
in-process stand-in for a worker pool."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import ClassVar

from cisrank.testing import SAMPLE_SENTENCES


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


def write_mini(root):
    """A made-up set whose reranked order a length reranker predicts: q1 with four candidates,
    q2 with one, q3 judged but without candidates."""
    hits = [
        hit("a", 1, 3.0, "x"),
        hit("b", 2, 2.0, "xxx"),
        hit("c", 3, 1.0, "xx"),
        hit("d", 4, 0.5, "xxxx"),
    ]
    return write_folder(
        root,
        {("q1", "query one"): hits, ("q2", "query two"): [hit("a", 1, 1.0, "x")]},
        qrels="q1 Q0 b 3\nq1 Q0 d 2\nq2 Q0 a 1\nq3 Q0 z 2\n",
        topics="q1\tquery one\nq2\tquery two\nq3\tno candidates\n",
    )


# Small query sets for the distillation tests (and the CLI's `distill` and `--workers` tests).
QUERIES = {
    "101": "When was the author of Hamlet born?",
    "102": "What is the capital of France?",
    "103": "How long can fleas live?",
    "104": "When did the United States enter World War I?",
    "105": "Who wrote Hamlet?",
    "106": "Do goldfish grow to the size of their tank?",
}


def write_set(root: Path, name: str, qids: list[str], depth: int = 5, judged: bool = True) -> Path:
    """Each query gets `depth` of the sample sentences (rotated, so lists differ by query)."""
    hits_by_query = {}
    qrels = []
    for n, qid in enumerate(qids):
        texts = [SAMPLE_SENTENCES[(n + k) % len(SAMPLE_SENTENCES)] for k in range(depth)]
        hits_by_query[(qid, QUERIES[qid])] = [
            hit(f"d{(n + k) % len(SAMPLE_SENTENCES)}", k + 1, 10.0 - k, t)
            for k, t in enumerate(texts)
        ]
        qrels += [f"{qid} Q0 d{(n + k) % len(SAMPLE_SENTENCES)} {k % 3}" for k in range(depth)]
    topics = "".join(f"{q}\t{QUERIES[q]}\n" for q in qids)
    return write_folder(
        root / name,
        hits_by_query,
        qrels="\n".join(qrels) + "\n" if judged else None,
        topics=topics,
    )


class InProcessPool:
    """A `WorkerPool` stand-in that runs its job here: what the pool is asked, without the
    seconds a spawned worker takes to start. Records every pool built."""

    built: ClassVar[list[InProcessPool]] = []

    def __init__(self, job, processes, threads_per_worker=1):
        self.processes = processes
        self.job = job
        self.state = job.load()
        self.items = 0
        InProcessPool.built.append(self)

    def warm(self):
        pass

    def submit(self, item):
        from concurrent.futures import Future

        future: Future = Future()
        self.items += 1
        future.set_result(self.job.score(self.state, item))
        return future

    def close(self):
        pass

    @classmethod
    def installed(cls, monkeypatch) -> list[InProcessPool]:
        """Every pool `cisrank.rerank.pooled` builds is one of these (the list of them)."""
        import cisrank.rerank.pooled as pooled

        cls.built = []
        monkeypatch.setattr(pooled, "WorkerPool", cls)
        return cls.built


# NQ-Open in the lost-in-the-middle oracle shape: question, answers, gold passage (title, text),
# in the words of the tiny tokenizer
NQ_ROWS = [
    ("who wrote hamlet ?", ["Shakespeare"], ("Hamlet", SAMPLE_SENTENCES[0])),
    ("when was shakespeare born ?", ["1564"], ("Shakespeare", SAMPLE_SENTENCES[1])),
    ("where is hamlet set ?", ["Denmark"], ("Denmark", SAMPLE_SENTENCES[2])),
    ("what is the capital of france ?", ["Paris"], ("Paris", SAMPLE_SENTENCES[5])),
    ("how long can fleas live ?", ["a year"], ("Fleas", SAMPLE_SENTENCES[6])),
    ("what grows to the size of their tank ?", ["Goldfish"], ("Goldfish", SAMPLE_SENTENCES[7])),
    ("what are wireless technologies ?", ["Bluetooth"], ("Bluetooth", SAMPLE_SENTENCES[8])),
    ("when did the united states enter world war i ?", ["1917"], ("War", SAMPLE_SENTENCES[9])),
]


def write_nq(path, rows, gz=True):
    """An NQ-Open oracle-shaped file of `rows` (question, answers, ctxs as (title, text), the
    gold's position among them): one JSON line each, gzipped or not."""
    lines = []
    for question, answers, ctxs, gold in rows:
        docs = [
            {"title": t, "text": x, "hasanswer": i == gold, "isgold": i == gold}
            for i, (t, x) in enumerate(ctxs)
        ]
        lines.append(json.dumps({"question": question, "answers": answers, "ctxs": docs}) + "\n")
    data = "".join(lines).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path
