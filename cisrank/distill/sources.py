"""Where the (query, passage) pairs to score come from: a TREC-style dataset or MS MARCO triples.

Every source becomes the same list of `QueryPairs`, in a fixed order, so that a resumed
`generate` can tell from a query's position which shard holds it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cisrank.data.datasets import load_local, load_named, read_topics, text_lines
from cisrank.data.types import Dataset
from cisrank.errors import DataError


@dataclass(frozen=True)
class QueryPairs:
    qid: str
    query: str
    docids: list[str]
    passages: list[str]
    ranks: list[int]


@dataclass
class PairSource:
    name: str
    queries: list[QueryPairs]
    identity: dict[str, Any]

    @property
    def num_pairs(self) -> int:
        return sum(len(q.docids) for q in self.queries)

    def digest(self) -> str:
        """sha256 of the pairs themselves (ids, texts, order): a resumed run must score the same
        pairs, wherever they were read from."""
        h = hashlib.sha256()
        for q in self.queries:
            h.update(f"{q.qid}\x1f{q.query}\x1e".encode())
            for d, t in zip(q.docids, q.passages, strict=True):
                h.update(f"{d}\x1f{t}\x1e".encode())
            h.update(b"\x1d")
        return h.hexdigest()


def _text_id(prefix: str, text: str) -> str:
    return prefix + hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def from_dataset(dataset: Dataset, depth: int) -> PairSource:
    queries = []
    for qid in dataset.qids:
        hits = dataset.candidates[qid][:depth]
        queries.append(
            QueryPairs(
                qid,
                dataset.topics[qid],
                [h.docid for h in hits],
                [h.text for h in hits],
                [h.rank for h in hits],
            )
        )
    if not queries:
        raise DataError(f"dataset '{dataset.name}' has no query with candidates")
    return PairSource(
        dataset.name, queries, {"dataset": dataset.name, "source": dataset.source, "depth": depth}
    )


def from_triples(path: str | Path, limit: int | None = None) -> PairSource:
    """MS MARCO `query<TAB>positive<TAB>negative` lines, grouped by query text.

    Triples carry no ids, so queries and passages get content ids (`q`/`p` + sha1 prefix): the
    same text always gets the same id, and repeated passages of a query are kept once."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"triples file '{path}' does not exist")
    grouped: dict[str, dict[str, str]] = {}
    for n, line in text_lines(path, "triples"):  # a line size cap; a bad byte is one line
        parts = line.rstrip("\r\n").split("\t")
        if len(parts) != 3 or not all(p.strip() for p in parts):
            raise DataError(
                f"{path}:{n}: expected query<TAB>positive<TAB>negative, got {len(parts)} field(s)"
            )
        query, pos, neg = parts
        docs = grouped.setdefault(query, {})
        for text in (pos, neg):
            docs.setdefault(_text_id("p", text), text)
        if limit is not None and len(grouped) >= limit:
            break
    if not grouped:
        raise DataError(f"triples file '{path}' is empty")
    queries = [
        QueryPairs(
            _text_id("q", q), q, list(docs), list(docs.values()), list(range(1, len(docs) + 1))
        )
        for q, docs in grouped.items()
    ]
    return PairSource(path.stem, queries, {"triples": str(path)})


def from_first_stage(topics: str | Path, indexes: Sequence[str | Path], depth: int) -> PairSource:
    """The top `depth` of each query of `topics` retrieved from `indexes` (several are fused by
    RRF, each contributing its top `depth`): how the student's training pairs are drawn from a
    pool corpus with the project's own first stage. Ranks are the first stage's."""
    from cisrank.indexes.first_stage import open_retriever, retrieve_candidates

    topics_path = Path(topics)
    if not topics_path.is_file():
        raise DataError(f"topics file '{topics_path}' does not exist")
    texts = read_topics(topics_path)
    retriever = open_retriever(indexes, depth=depth)
    candidates = retrieve_candidates(retriever, texts, depth)
    queries = [
        QueryPairs(
            qid,
            texts[qid],
            [h.docid for h in hits],
            [h.text for h in hits],
            [h.rank for h in hits],
        )
        for qid, hits in candidates.items()
        if hits
    ]
    if not queries:
        raise DataError(f"no query of '{topics_path}' retrieved anything")
    return PairSource(
        topics_path.stem,
        queries,
        {
            "topics": str(topics_path),
            "first_stage": [str(p) for p in indexes],
            "retriever": retriever.name,
            "depth": depth,
        },
    )


def load_source(
    *,
    dataset: str | None = None,
    data_dir: str | Path | None = None,
    candidates: str | Path | None = None,
    topics: str | Path | None = None,
    triples: str | Path | None = None,
    first_stage: Sequence[str | Path] | None = None,
    depth: int = 100,
) -> PairSource:
    """Exactly one of a dataset name, a candidates file, a triples file or topics retrieved
    from first-stage indexes."""
    given = [x for x in (dataset, candidates, triples, first_stage or None) if x is not None]
    if len(given) != 1:
        raise DataError(
            "give exactly one of --dataset NAME, --candidates FILE, --triples FILE or "
            "--first-stage INDEX (with --topics)"
        )
    if depth < 1:
        raise DataError(f"--depth must be >= 1, got {depth}")
    if triples is not None:
        return from_triples(triples)
    if first_stage:
        if topics is None:
            raise DataError("--first-stage needs --topics FILE (qid<TAB>query)")
        return from_first_stage(topics, first_stage, depth)
    if candidates is not None:
        cand = Path(candidates)
        ds = load_local(
            cand.name.split(".")[0],
            topics=Path(topics) if topics else None,
            candidates=cand,
            require_qrels=False,
        )
        return from_dataset(ds, depth)
    assert dataset is not None  # exactly one of the three was given, checked above
    return from_dataset(load_named(dataset, data_dir, require_qrels=False), depth)
