"""`distill synth`: training queries written from a corpus's own passages, kept only where the
passage is found again.

A user with a corpus and no labelled queries has what a student needs but the queries. Here a
causal LM writes, for each passage, `queries_per_passage` queries from a few-shot prompt
(`cisrank.distill.synth_prompt`: InPars' prompt, shots drawn per passage), and a query is kept
only where its source passage is ranked in the top `keep_top` of the query's candidates by the
filter (Promptagator's round-trip consistency: the first stage's order, or a teacher's over the
first stage's candidates and the source). What is written is what `distill generate` and
`distill train` read: `topics.tsv`, `candidates.json.gz` (the first stage's top `depth` of each
kept query, its source added where missing) and `qrels.txt` (the source as the judged positive),
beside `queries.jsonl` (every query written, with why each was dropped) and `synth.json`.

The job has three steps, each kept on disk so that an interrupted run resumes where it stopped:
the generations (shards of passages on the shard runner, a worker per core, each shard written
whole), the filter's rank of every source (`filter.jsonl`, keyed by the filter's settings, so a
rerun with another `keep_top` ranks nothing again), and the outputs (written atomically last).
Generation is a function of the seed and the passage: shots are drawn per (passage, query
number), greedy decoding is the default and sampling draws from a generator seeded per query.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cisrank.data.corpus import CorpusReader
from cisrank.data.datasets import guarded_json, json_lines
from cisrank.distill.config import SynthConfig
from cisrank.distill.synth_prompt import (
    Shot,
    SynthItem,
    clean,
    draw_shots,
    query_key,
    read_shots,
    rejection,
    render,
)
from cisrank.errors import DataError
from cisrank.fileio import atomic_write_bytes, atomic_write_text
from cisrank.jobs.pool import WorkerOptions
from cisrank.jobs.ray import Engine
from cisrank.jobs.shards import Progress, Shards, ShardWriter, run_shards
from cisrank.version import __version__

log = logging.getLogger(__name__)

GENERATED = "generated"
FILTER_FILE = "filter.jsonl"
QUERIES_FILE = "queries.jsonl"
TOPICS_FILE = "topics.tsv"
CANDIDATES_FILE = "candidates.json.gz"
QRELS_FILE = "qrels.txt"
SUMMARY_FILE = "synth.json"
HELD_OUT = "held-out"
"""Why a query that is an evaluation set's query is dropped."""


class SynthShardJob:
    """Generation as the shard runner runs it: the generator loaded once per process, then each
    shard's prompts prefilled and decoded side by side (`CausalLMEngine.decode_rows`)."""

    def __init__(self, config: SynthConfig) -> None:
        self.config = config

    def load(self) -> Any:
        from cisrank.lm.backends import load_engine

        return load_engine(self.config.generator, backend="torch", dtype=self.config.dtype)

    def describe(self, engine: Any) -> dict[str, Any]:
        return {
            "generator": engine.model_name,
            "compute_type": engine.compute_type,
            "fingerprint": engine.fingerprint(),
        }

    def score(self, engine: Any, block: Sequence[SynthItem]) -> list[dict[str, Any]]:
        from cisrank.distill.synth_decode import generate_queries

        return generate_queries(engine, block, self.config)


def _seeds_digest(*parts: Any) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\x1e")
    return h.hexdigest()


def corpus_passages(path: str | Path) -> dict[str, str]:
    """docid -> text of a corpus file (the `index build` formats), in file order."""
    corpus = CorpusReader(path).load()
    return dict(zip(corpus.docids, corpus.texts, strict=True))


def sample_order(docids: Sequence[str], seed: int) -> list[str]:
    """The passages in the order queries are written for them: by a hash of the seed and the
    docid, so any sample is a prefix of the whole order (and of every larger sample), whatever
    the order of the corpus file."""

    def key(docid: str) -> bytes:
        return hashlib.sha256(f"order\x1f{seed}\x1f{docid}".encode()).digest()

    return sorted(docids, key=key)


def plan_items(
    passages: dict[str, str], shots: Sequence[Shot], config: SynthConfig
) -> list[SynthItem]:
    """Every query to write, passages in their sample order (`sample_order`, cut to
    `config.passages`), each query with its own shots (`draw_shots`)."""
    order = sample_order(list(passages), config.seed)[: config.passages]
    items = []
    for docid in order:
        text = passages[docid]
        for n in range(config.queries_per_passage):
            drawn = draw_shots(shots, config.num_shots, config.seed, docid, n)
            prompt = render(
                drawn, text, shot_chars=config.shot_chars, passage_chars=config.passage_chars
            )
            items.append(SynthItem(docid, n, prompt))
    return items


def _shard_lines(path: Path) -> int | None:
    try:
        with path.open("rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return None


def _shard_path(out: Path, i: int) -> Path:
    return out / GENERATED / f"shard-{i:05d}.jsonl"


def _encode_shard(_: int, rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def generate_all(
    items: list[SynthItem],
    config: SynthConfig,
    out: Path,
    identity: dict[str, Any],
    *,
    workers: WorkerOptions | None,
    progress: bool,
) -> list[dict[str, Any]]:
    """Every item's generation, from the shards already written and the shards scored now."""
    size = config.shard_passages * config.queries_per_passage
    chunks = [items[k : k + size] for k in range(0, len(items), size)]
    run_info: dict[str, Any] = {}

    def plan(described: dict[str, Any]) -> Shards[list[SynthItem]]:
        run_info.update(described)
        return Shards(
            items=chunks,
            rows=len,
            block=lambda _i, chunk: chunk,
            complete=lambda i, rows: _shard_lines(_shard_path(out, i)) == rows,
            folder=out / GENERATED,
            meta={**identity, "generator": described},
        )

    run_shards(
        SynthShardJob(config),
        plan,
        ShardWriter(lambda i: _shard_path(out, i), _encode_shard),
        engine=Engine.LOCAL,
        resume=True,
        progress=Progress(lambda d: f"synth {d['generator']}", "query", progress, len(items)),
        workers=workers,
    )
    rows: list[dict[str, Any]] = []
    for i in range(len(chunks)):
        rows += [row for _, row in json_lines(_shard_path(out, i), "generated queries")]
    if len(rows) != len(items):
        raise RuntimeError(f"{len(rows)} generations read back for {len(items)} queries")
    return rows


@dataclass
class Written:
    """One generated query after cleaning: kept so far unless `dropped` says why not."""

    qid: str
    docid: str
    n: int
    text: str
    query: str
    dropped: str | None = None
    source_rank: int | None = None


def clean_all(
    rows: Sequence[dict[str, Any]],
    shots: Sequence[Shot],
    config: SynthConfig,
    held_out: Collection[str] = (),
) -> list[Written]:
    """Every reply cleaned and judged: no query (`synth_prompt.rejection`), `held-out` (the
    text of a query in `held_out`, keys of `query_key`: an evaluation set's queries are never
    trained on, even when a generator writes one from another passage), or `duplicate` of a
    query written earlier (case and spacing aside), the first one kept."""
    seen: set[str] = set()
    out = []
    for r in rows:
        query = clean(r["text"])
        drawn = draw_shots(shots, config.num_shots, config.seed, r["docid"], r["n"])
        why = rejection(query, drawn, config.max_words)
        key = query_key(query)
        if why is None and key in held_out:
            why = HELD_OUT
        if why is None:
            why = "duplicate" if key in seen else None
            seen.add(key)
        out.append(Written(f"{r['docid']}#q{r['n']}", r["docid"], r["n"], r["text"], query, why))
    return out


@dataclass(frozen=True)
class FilterRanks:
    """A query's first-stage candidates (docid, score) and its source passage's rank among
    them by the filter (None: not among the candidates ranked)."""

    hits: list[tuple[str, float]]
    rank: int | None


def _source_rank(order: Sequence[str], source: str) -> int | None:
    return order.index(source) + 1 if source in order else None


def rank_sources(
    queries: Sequence[Written],
    passages: dict[str, str],
    retriever: Any,
    config: SynthConfig,
    teacher: Any = None,
) -> dict[str, FilterRanks]:
    """qid -> the first stage's top `depth` and the source's rank: by the first stage, or, with
    a teacher, by the teacher's scores of those candidates and the source (ties keep the first
    stage's order)."""
    from cisrank.distill.teachers import QueryItems

    results = retriever.batch_search([q.query for q in queries], config.depth)
    ranks: dict[str, FilterRanks] = {}
    items = []
    for q, hits in zip(queries, results, strict=True):
        listed = [(h.docid, float(h.score)) for h in hits]
        docids = [d for d, _ in listed]
        if teacher is None:
            ranks[q.qid] = FilterRanks(listed, _source_rank(docids, q.docid))
            continue
        judged = docids if q.docid in docids else [*docids, q.docid]
        items.append((q, listed, judged))
    if teacher is not None and items:
        got = teacher.score_many(
            [QueryItems(q.qid, q.query, d, [passages[x] for x in d]) for q, _, d in items]
        )
        for (q, listed, judged), scores in zip(items, got, strict=True):
            order = sorted(range(len(judged)), key=lambda i: (-scores.score[i], i))
            ranks[q.qid] = FilterRanks(listed, _source_rank([judged[i] for i in order], q.docid))
    return ranks


class FilterStore:
    """The filter's ranks on disk (`filter.jsonl`, its first line the filter's identity): a
    rerun with the same filter reads them back and ranks only the queries left; another filter
    starts the file again. Appended a chunk at a time, each chunk one write, so a stop loses
    at most the chunk being ranked (a torn last line is dropped on reading)."""

    def __init__(self, path: Path, identity: dict[str, Any]) -> None:
        self.path, self.identity = path, identity
        self.ranks: dict[str, FilterRanks] = {}
        head = json.dumps({"filter": identity}, sort_keys=True)
        lines = path.read_text(encoding="utf-8").split("\n") if path.is_file() else []
        if lines and lines[0] == head:
            for line in lines[1:]:
                try:
                    row = guarded_json(line, str(path))
                except DataError:
                    continue  # the torn tail of an interrupted append
                self.ranks[row["qid"]] = FilterRanks([tuple(h) for h in row["hits"]], row["rank"])
            atomic_write_text(path, "\n".join([head, *self._lines(self.ranks)]) + "\n")
        else:
            atomic_write_text(path, head + "\n")

    @staticmethod
    def _lines(ranks: dict[str, FilterRanks]) -> list[str]:
        return [
            json.dumps({"qid": q, "hits": r.hits, "rank": r.rank}, ensure_ascii=False)
            for q, r in ranks.items()
        ]

    def add(self, ranks: dict[str, FilterRanks]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in self._lines(ranks)))
        self.ranks.update(ranks)


def filter_queries(
    queries: list[Written],
    passages: dict[str, str],
    config: SynthConfig,
    out: Path,
    *,
    retriever: Any,
    retriever_name: str,
    teacher_spec: Any = None,
    progress: bool = True,
    chunk: int = 256,
) -> dict[str, FilterRanks]:
    """The source rank of every query not dropped yet, resumed from `filter.jsonl`."""
    from tqdm.auto import tqdm

    live = [q for q in queries if q.dropped is None]
    teacher = None
    identity = {
        "first_stage": retriever_name,
        "depth": config.depth,
        "filter": config.filter,
        "teacher": None if teacher_spec is None else _spec_json(teacher_spec),
    }
    store = FilterStore(out / FILTER_FILE, identity)
    todo = [q for q in live if q.qid not in store.ranks]
    if todo and config.filter == "teacher":
        teacher = teacher_spec.load()
    with tqdm(
        total=len(live),
        initial=len(live) - len(todo),
        desc="filter",
        unit="query",
        disable=not progress,
    ) as bar:
        for k in range(0, len(todo), chunk):
            part = todo[k : k + chunk]
            store.add(rank_sources(part, passages, retriever, config, teacher))
            bar.update(len(part))
    return store.ranks


def _spec_json(spec: Any) -> dict[str, Any]:
    return {
        "name": spec.name,
        "model": spec.model,
        "scores_file": spec.scores_file,
        "options": dict(spec.options),
    }


def apply_filter(
    queries: list[Written], ranks: dict[str, FilterRanks], config: SynthConfig
) -> None:
    """Mark each live query with its source rank, and drop it (`filter`) where the rank is not
    within `keep_top` (the filter `none` keeps every one, ranks recorded)."""
    for q in queries:
        if q.dropped is not None:
            continue
        q.source_rank = ranks[q.qid].rank
        if config.filter != "none" and (q.source_rank is None or q.source_rank > config.keep_top):
            q.dropped = "filter"


def write_outputs(
    out: Path,
    queries: list[Written],
    ranks: dict[str, FilterRanks],
    passages: dict[str, str],
    summary: dict[str, Any],
) -> None:
    """queries.jsonl, then the kept queries' topics, qrels and candidates, then synth.json: each
    file written whole (temp file and rename), the summary last, so a folder with a summary
    holds a complete set."""
    atomic_write_text(
        out / QUERIES_FILE,
        "".join(
            json.dumps(
                {
                    "qid": q.qid,
                    "docid": q.docid,
                    "n": q.n,
                    "query": q.query,
                    "reply": q.text,
                    "dropped": q.dropped,
                    "source_rank": q.source_rank,
                },
                ensure_ascii=False,
            )
            + "\n"
            for q in queries
        ),
    )
    kept = [q for q in queries if q.dropped is None]
    atomic_write_text(out / TOPICS_FILE, "".join(f"{q.qid}\t{q.query}\n" for q in kept))
    atomic_write_text(out / QRELS_FILE, "".join(f"{q.qid} 0 {q.docid} 1\n" for q in kept))
    lists = [_hits(q, ranks[q.qid].hits, passages) for q in kept]
    entries = [{"query": q.query, "hits": hits} for q, hits in zip(kept, lists, strict=True)]
    data = json.dumps(entries, ensure_ascii=False).encode()
    atomic_write_bytes(out / CANDIDATES_FILE, gzip.compress(data, mtime=0))
    atomic_write_text(out / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")


def _hits(q: Written, hits: list[tuple[str, float]], passages: dict[str, str]) -> list[dict]:
    """The first stage's candidates of `q`, its source passage added last where it is absent
    (scored as the last candidate: a list to train on holds the passage its query came from)."""
    listed = list(hits)
    if q.docid not in {d for d, _ in listed}:
        listed.append((q.docid, listed[-1][1] if listed else 0.0))
    return [
        {"qid": q.qid, "docid": d, "content": passages[d], "rank": r, "score": s}
        for r, (d, s) in enumerate(listed, 1)
    ]


def synthesize(
    corpus: str | Path,
    out: str | Path,
    config: SynthConfig,
    *,
    shots: str | Path,
    first_stage: Sequence[str | Path] = (),
    teacher: Any = None,
    held_out: Mapping[str, Collection[str]] | None = None,
    workers: WorkerOptions | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Write, filter and save training queries for `corpus` into `out` (see the module
    docstring); returns the summary written to `synth.json`. `first_stage`: index folders whose
    fused top `depth` are a query's candidates (default: BM25 over the corpus, in memory);
    `teacher`: the `TeacherSpec` of the `teacher` filter; `held_out`: query sets by name (DL19,
    DL21) whose queries are dropped wherever one is written (compared as `query_key`s; a
    judgment, not the generation, so a resumed run with other sets generates nothing again)."""
    started = time.perf_counter()
    if (config.filter == "teacher") != (teacher is not None):
        raise DataError(
            "--filter teacher needs --filter-teacher (and its --filter-model)"
            if teacher is None
            else f"--filter-teacher is read by --filter teacher only, not --filter {config.filter}"
        )
    out = Path(out)
    passages = corpus_passages(corpus)
    shot_list = read_shots(shots)
    items = plan_items(passages, shot_list, config)
    identity = {
        "corpus_sha256": _seeds_digest(list(passages.items())),
        "shots_sha256": _seeds_digest([(s.query, s.passage) for s in shot_list]),
        "config": config.model_dump(
            mode="json", exclude={"filter", "keep_top", "depth", "shard_passages", "passages"}
        ),
        "shard_passages": config.shard_passages,
    }
    out.mkdir(parents=True, exist_ok=True)
    rows = generate_all(items, config, out, identity, workers=workers, progress=progress)
    generated_s = time.perf_counter() - started
    held = held_out or {}
    held_keys = {query_key(q) for texts in held.values() for q in texts}
    queries = clean_all(rows, shot_list, config, held_keys)
    retriever, retriever_name = _first_stage(first_stage, passages, config.depth)
    ranks = filter_queries(
        queries,
        passages,
        config,
        out,
        retriever=retriever,
        retriever_name=retriever_name,
        teacher_spec=teacher,
        progress=progress,
    )
    apply_filter(queries, ranks, config)
    summary = _summary(queries, config, corpus, shots, first_stage, teacher, len(passages))
    summary["held_out"] = {name: len(texts) for name, texts in held.items()}
    summary["sampled_passages"] = len({it.docid for it in items})
    summary["seconds"] = {
        "generate": round(generated_s, 1),
        "total": round(time.perf_counter() - started, 1),
    }
    write_outputs(out, queries, ranks, passages, summary)
    return summary


def _first_stage(
    indexes: Sequence[str | Path], passages: dict[str, str], depth: int
) -> tuple[Any, str]:
    if indexes:
        from cisrank.indexes.first_stage import open_retriever

        paths = [str(p) for p in indexes]
        return open_retriever(paths, depth=depth), "+".join(paths)
    from cisrank.retrieval.bm25 import MemoryBM25

    return MemoryBM25(list(passages.values()), list(passages)), "bm25 (in memory, the corpus)"


def _summary(
    queries: list[Written],
    config: SynthConfig,
    corpus: str | Path,
    shots: str | Path,
    first_stage: Sequence[str | Path],
    teacher: Any,
    passages: int,
) -> dict[str, Any]:
    dropped = Counter(q.dropped for q in queries if q.dropped is not None)
    ranked = [q.source_rank for q in queries if q.dropped in (None, "filter")]
    kept = sum(q.dropped is None for q in queries)
    return {
        "kind": "distill-synth",
        "corpus": str(corpus),
        "passages": passages,
        "shots": str(shots),
        "first_stage": [str(p) for p in first_stage] or "bm25 over the corpus (in memory)",
        "filter_teacher": None if teacher is None else _spec_json(teacher),
        "config": config.model_dump(mode="json"),
        "written": len(queries),
        "kept": kept,
        "dropped": dict(sorted(dropped.items())),
        "source_rank_at_most": {
            str(k): sum(r is not None and r <= k for r in ranked) for k in (1, 2, 3, 5, 10)
        },
        "kept_passages": len({q.docid for q in queries if q.dropped is None}),
        "cisrank_version": __version__,
    }
