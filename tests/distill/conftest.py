"""Small query sets in the layout of ../shared/data for the distillation tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import hit, write_folder

from cisrank.testing import SAMPLE_SENTENCES

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


@pytest.fixture
def data_sets(tmp_path: Path) -> Path:
    """trec-dl22 (unjudged, training), trec-dl21 (judged, dev), trec-dl19 (judged, test)."""
    root = tmp_path / "data"
    write_set(root, "trec-dl22", ["101", "102", "103", "104"], judged=False)
    write_set(root, "trec-dl21", ["105", "106"])
    write_set(root, "trec-dl19", ["101", "104", "106"])
    return root
