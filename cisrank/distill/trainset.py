"""The student's training pool: every passage available here that no test or dev set judges, and
the MS MARCO training queries that retrieve from it.

Why a pool of its own: a student learns from the teacher's scores on (query, passage) pairs, and
those pairs must never come from a test set (DL19, DL20) or the dev set (DL21, whose queries and
pool passages choose every recipe). The passages that are available offline for training are
DL22's BM25 pool (MS MARCO v2) and the passages of the MS MARCO training triples (v1); any
passage whose text is a DL19 or DL21 candidate is left out (matched by content, since v1 and v2
ids differ). DL20 is not in `../shared/data`, so it cannot be excluded by content here; the
triples are MS MARCO *training* passages.

`build_pool` writes the corpus (`pool.jsonl`, for `cisrank index build bm25|dense`), the
training topics (`topics.tsv`, qids are content ids as in `distill generate --triples`), their
judged positives (`qrels.txt`: each triple's positive, the labelled passage `distill generate
--teacher qrels` scores 1) and a `pool.json` with the counts. The candidates come from the project's own indexes:

    cisrank distill pool --out out/trainset
    cisrank index build bm25 --corpus out/trainset/pool.jsonl --out out/trainset/bm25
    cisrank index build dense --corpus out/trainset/pool.jsonl --out out/trainset/dense
    cisrank distill generate --topics out/trainset/topics.tsv \\
        --first-stage out/trainset/bm25 --first-stage out/trainset/dense --depth 30 ...
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cisrank import env
from cisrank.data.datasets import load_named, text_lines
from cisrank.errors import DataError
from cisrank.fileio import atomic_write_text

POOL_FILE = "pool.jsonl"
TOPICS_FILE = "topics.tsv"
QRELS_FILE = "qrels.txt"
INFO_FILE = "pool.json"
POOL_SETS = ("trec-dl22",)
EXCLUDED_SETS = ("trec-dl19", "trec-dl21")
TRIPLES = Path("msmarco-train") / "triples.train.small.first1000.tsv"


def content_id(prefix: str, text: str) -> str:
    """The id a text gets where it has none (triples): `prefix` + sha1 prefix of the text, the
    same as `distill generate --triples` gives, so rows from both join on it."""
    return prefix + hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def text_key(text: str) -> str:
    """Content key for exclusion: the whitespace-trimmed text's sha256."""
    return hashlib.sha256(text.strip().encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class PoolInfo:
    passages: int
    by_source: dict[str, int]
    excluded: dict[str, int]
    queries: int
    out: Path
    sets: tuple[str, ...] = POOL_SETS
    held_out: tuple[str, ...] = EXCLUDED_SETS

    def to_json(self) -> dict[str, Any]:
        return {
            "sets": list(self.sets),
            "held_out": list(self.held_out),
            "passages": self.passages,
            "by_source": self.by_source,
            "excluded_by_content": self.excluded,
            "queries": self.queries,
        }


def read_triples(path: Path) -> list[tuple[str, str, str]]:
    rows = []
    for n, line in text_lines(path, "triples"):  # a line size cap; a bad byte is one line
        parts = line.rstrip("\r\n").split("\t")
        if len(parts) != 3 or not all(p.strip() for p in parts):
            raise DataError(f"{path}:{n}: expected query<TAB>positive<TAB>negative")
        rows.append((parts[0], parts[1], parts[2]))
    if not rows:
        raise DataError(f"triples file '{path}' is empty")
    return rows


def build_pool(
    out: str | Path,
    data_dir: str | Path,
    sets: Sequence[str] = POOL_SETS,
    held_out: Sequence[str] = EXCLUDED_SETS,
) -> PoolInfo:
    """Write `pool.jsonl`, `topics.tsv` and `pool.json` under `out` (each atomically): the
    passages of `sets` and of the training triples, less every passage whose text is one of
    `held_out`'s. The defaults are the data rules (DL19 reported, DL21 the dev set); other sets
    rebuild the pool a past teacher set was drawn from (its provenance says which)."""
    both = sorted(set(sets) & set(held_out))
    if both:
        raise DataError(f"a set cannot be both pooled and held out: {', '.join(both)}")
    root = Path(data_dir)
    out = Path(out)
    excluded_keys: set[str] = set()
    for name in held_out:
        ds = load_named(name, root / name, require_qrels=False)
        excluded_keys.update(text_key(t) for t in ds.passages().values())
    pool: dict[str, str] = {}
    seen: set[str] = set()
    by_source: dict[str, int] = {}
    excluded: dict[str, int] = {}

    def add(source: str, docid: str, text: str) -> None:
        key = text_key(text)
        if key in excluded_keys:
            excluded[source] = excluded.get(source, 0) + 1
            return
        if docid in pool or key in seen:
            return
        pool[docid] = text
        seen.add(key)
        by_source[source] = by_source.get(source, 0) + 1

    for name in sets:
        ds = load_named(name, root / name, require_qrels=False)
        for docid, text in ds.passages().items():
            add(name, docid, text)
    triples_path = root / TRIPLES
    if not triples_path.is_file():
        raise DataError(f"no MS MARCO triples at {triples_path}: pass the data folder")
    triples = read_triples(triples_path)
    topics: dict[str, str] = {}
    positives: dict[tuple[str, str], None] = {}
    for query, pos, neg in triples:
        for text in (pos, neg):
            add("msmarco-train", content_id("p", text), text)
        topics.setdefault(content_id("q", query), query)
        if content_id("p", pos) in pool:
            positives.setdefault((content_id("q", query), content_id("p", pos)), None)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        out / POOL_FILE,
        "".join(
            json.dumps({"id": d, "text": t}, ensure_ascii=False) + "\n" for d, t in pool.items()
        ),
    )
    atomic_write_text(out / TOPICS_FILE, "".join(f"{q}\t{t}\n" for q, t in topics.items()))
    atomic_write_text(out / QRELS_FILE, "".join(f"{q} 0 {d} 1\n" for q, d in positives))
    info = PoolInfo(len(pool), by_source, excluded, len(topics), out, tuple(sets), tuple(held_out))
    atomic_write_text(out / INFO_FILE, json.dumps(info.to_json(), indent=2) + "\n")
    return info


def default_shots() -> Path:
    """The examples `distill synth` shows its generator by default: the MS MARCO training triples
    of the data folder (their positives, with the queries they answer)."""
    root = env.data_dir()
    if root is None:
        raise DataError(
            "no --shots file and no data folder: pass --shots FILE (query<TAB>passage lines) or "
            "set CISRANK_DATA_DIR (its MS MARCO training triples are the default examples)"
        )
    path = root / TRIPLES
    if not path.is_file():
        raise DataError(f"no MS MARCO training triples at {path}: pass --shots FILE")
    return path
