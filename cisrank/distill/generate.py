"""`distill generate`: teacher scores for every (query, passage) pair of a source, as Parquet.

Safe to interrupt: shards are written whole, and a rerun with the same source and teacher skips
the shards that exist. A rerun with a different source or teacher refuses to mix the two unless
told to `overwrite`.

The shards run on the shard runner (`cisrank.jobs.shards`): in this process, on a pool of
`workers`, or with `engine="ray"` on a Ray actor pool; wherever it runs, the teacher is built
once from its `TeacherSpec` and scores whole shards through the same `_shard_columns`, and this
process writes the shard files, the same ones, so a run interrupted on one engine resumes on the
other.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cisrank.distill import rows as R
from cisrank.distill.sources import PairSource, QueryPairs
from cisrank.distill.teachers import QueryItems, Teacher, TeacherSpec
from cisrank.errors import CisrankError, DataError
from cisrank.jobs.pool import WorkerOptions
from cisrank.jobs.ray import POS, SHARD, Engine, RayOptions, check_engine
from cisrank.jobs.shards import Progress, Shards, ShardWriter, run_shards
from cisrank.version import __version__

log = logging.getLogger(__name__)


@dataclass
class GenerateResult:
    out: Path
    manifest: dict[str, Any]
    shards_written: int
    shards_reused: int


def shard_plan(source: PairSource, shard_pairs: int, by: str = "query") -> list[list[QueryPairs]]:
    """The shards of a source, fixed by the source alone so that a resumed run finds the same
    boundaries. `by="query"`: whole queries, a new shard once one holds `shard_pairs` pairs or
    more. `by="passage"`: every pair of a passage (by docid) in one shard, passages in order of
    first appearance, cut the same way; a shard then holds, per query, that query's pairs of its
    passages (queries in source order), so a teacher that shares work across the queries of a
    passage (`Teacher.passage_major`) sees all of them in one call."""
    if by == "query":
        shards: list[list[QueryPairs]] = [[]]
        size = 0
        for q in source.queries:
            if size >= shard_pairs:
                shards.append([])
                size = 0
            shards[-1].append(q)
            size += len(q.docids)
        return shards
    if by != "passage":
        raise ValueError(f"shards are cut by 'query' or 'passage', not {by!r}")
    pairs_of: dict[str, list[tuple[int, int]]] = {}
    for qi, q in enumerate(source.queries):
        for j, docid in enumerate(q.docids):
            pairs_of.setdefault(docid, []).append((qi, j))
    groups: list[list[tuple[int, int]]] = [[]]
    for refs in pairs_of.values():
        if len(groups[-1]) >= shard_pairs:
            groups.append([])
        groups[-1].extend(refs)
    out = []
    for refs in groups:
        per_query: dict[int, list[int]] = {}
        for qi, j in sorted(refs):
            per_query.setdefault(qi, []).append(j)
        out.append(
            [
                QueryPairs(
                    (q := source.queries[qi]).qid,
                    q.query,
                    [q.docids[j] for j in js],
                    [q.passages[j] for j in js],
                    [q.ranks[j] for j in js],
                )
                for qi, js in per_query.items()
            ]
        )
    return out


def _pairs(chunk: Sequence[QueryPairs]) -> int:
    return sum(len(q.docids) for q in chunk)


def _identity(
    source: PairSource, teacher: dict[str, Any], shard_pairs: int, by: str
) -> dict[str, Any]:
    identity = {
        "source": source.identity,
        "pairs_sha256": source.digest(),
        "teacher": teacher,
        "shard_pairs": shard_pairs,
    }
    if by != "query":  # absent for query shards, as in runs written before passage shards
        identity["shards_by"] = by
    # As it will read back from JSON, so that a resumed run compares equal.
    return json.loads(json.dumps(identity, sort_keys=True, default=str))


def _claim(out: Path, identity: dict[str, Any], overwrite: bool) -> dict[str, Any] | None:
    """Make `out` ours for this identity; the finished manifest if it is already done."""
    manifest = R.read_json(out / R.MANIFEST) if out.is_dir() else None
    state = R.read_json(out / R.STATE) if out.is_dir() else None
    ours = manifest if manifest is not None else state
    if ours is not None and ours.get("identity") == identity and not overwrite:
        return manifest
    if out.is_dir() and any(out.iterdir()):
        if ours is None:
            raise DataError(
                f"'{out}' is not empty and holds no distill output: pick an empty or new folder"
            )
        if not overwrite:
            what = "finished" if manifest is not None else "unfinished"
            raise DataError(
                f"'{out}' holds an {what} generate run with another source or teacher; "
                "pass --overwrite to replace it, or pick another --out"
            )
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    R.write_json(out / R.STATE, {"identity": identity, "started": time.time()})
    return None


def _shard_columns(teacher: Teacher, chunk: Sequence[QueryPairs]) -> dict[str, list[Any]]:
    """The teacher's rows of a shard's queries, as columns of `rows.SCHEMA`, scored in one call
    (both engines' one path)."""
    got = teacher.score_many([QueryItems(q.qid, q.query, q.docids, q.passages) for q in chunk])
    if len(got) != len(chunk):
        raise RuntimeError(f"teacher returned {len(got)} score lists for {len(chunk)} queries")
    cols: dict[str, list[Any]] = {f.name: [] for f in R.SCHEMA}
    for q, scores in zip(chunk, got, strict=True):
        n = len(q.docids)
        if len(scores.score) != n:
            raise RuntimeError(f"teacher returned {len(scores.score)} scores for {n} pairs")
        cols["qid"] += [q.qid] * n
        cols["docid"] += list(q.docids)
        cols["query"] += [q.query] * n
        cols["passage"] += list(q.passages)
        cols["rank"] += list(q.ranks)
        cols["score"] += [float(v) for v in scores.score]
        cols["log_conditional"] += (
            list(scores.log_conditional) if scores.log_conditional else [None] * n
        )
        cols["log_prior"] += list(scores.log_prior) if scores.log_prior else [None] * n
    return cols


class TeacherShardJob:
    """Teacher scoring as the shard runner runs it: the teacher built once per process or actor
    from its spec (or, in this process only, one already loaded), then each shard's queries
    through `_shard_columns`, in order."""

    def __init__(self, spec: TeacherSpec | None, teacher: Teacher | None = None) -> None:
        self.spec = spec
        self.teacher = teacher

    def load(self) -> Teacher:
        if self.teacher is not None:
            return self.teacher
        assert self.spec is not None
        return self.spec.load()

    def describe(self, teacher: Teacher) -> dict[str, Any]:
        return teacher.describe()

    def score(self, teacher: Teacher, batch: Any) -> Any:
        import pyarrow as pa

        rows = batch.to_pydict()
        chunk: list[QueryPairs] = []
        n = len(rows[POS])
        start = 0
        while start < n:  # runs of one query (`qpos`: its place in the shard)
            end = start + 1
            while end < n and rows["qpos"][end] == rows["qpos"][start]:
                end += 1
            chunk.append(
                QueryPairs(
                    rows["qid"][start],
                    rows["query"][start],
                    rows["docid"][start:end],
                    rows["passage"][start:end],
                    rows["rank"][start:end],
                )
            )
            start = end
        out = _shard_columns(teacher, chunk)
        out[SHARD], out[POS] = rows[SHARD], rows[POS]
        schema = R.SCHEMA.append(pa.field(SHARD, pa.int64())).append(pa.field(POS, pa.int64()))
        return pa.table(out, schema=schema)


def _shard_block(index: int, chunk: list[QueryPairs]) -> Any:
    import pyarrow as pa

    cols: dict[str, list[Any]] = {
        k: [] for k in (SHARD, POS, "qpos", "qid", "query", "docid", "passage", "rank")
    }
    for qpos, q in enumerate(chunk):
        n = len(q.docids)
        cols["qpos"] += [qpos] * n
        cols["qid"] += [q.qid] * n
        cols["query"] += [q.query] * n
        cols["docid"] += q.docids
        cols["passage"] += q.passages
        cols["rank"] += q.ranks
    cols[SHARD] = [index] * len(cols["qid"])
    cols[POS] = list(range(len(cols["qid"])))
    return pa.table(cols)


def generate(
    source: PairSource,
    teacher: Teacher | TeacherSpec,
    out: str | Path,
    *,
    shard_pairs: int = 2048,
    overwrite: bool = False,
    progress: bool = True,
    engine: str | None = None,
    ray: RayOptions | None = None,
    workers: WorkerOptions | None = None,
    job_wrapper: Callable[[Any], Any] | None = None,
) -> GenerateResult:
    """Score every pair of `source` with `teacher` into Parquet shards under `out`, on the shard
    runner (`cisrank.jobs.shards`).

    `teacher` is a loaded teacher, or a `TeacherSpec` (loaded here for the local engine; the
    Ray engine and a local pool of several `workers` need a spec: each worker loads its own).
    `job_wrapper` wraps the job wherever it scores (tests use it to count or kill it)."""
    if shard_pairs < 1:
        raise DataError(f"--shard-pairs must be >= 1, got {shard_pairs}")
    engine_ = check_engine(engine)
    out = Path(out)
    if not isinstance(teacher, TeacherSpec):
        if engine_ is Engine.RAY:
            raise CisrankError("--engine ray builds the teacher on every actor: pass its spec")
        if workers is not None and workers.count > 1:
            raise CisrankError("--workers builds the teacher in every worker: pass its spec")
    by = "passage" if teacher.passage_major else "query"
    run_state: dict[str, Any] = {}

    def plan(described: dict[str, Any]) -> Shards[list[QueryPairs]] | None:
        identity = _identity(source, described, shard_pairs, by)
        done = _claim(out, identity, overwrite)
        chunks = shard_plan(source, shard_pairs, by)
        run_state.update(identity=identity, done=done, shards=len(chunks))
        if done is not None:
            return None
        run_state["started"] = time.perf_counter()
        return Shards(
            items=chunks,
            rows=_pairs,
            block=_shard_block,
            complete=lambda i, pairs: R.shard_rows(R.shard_path(out, i)) == pairs,
        )

    spec = teacher if isinstance(teacher, TeacherSpec) else None
    run = run_shards(
        TeacherShardJob(spec, None if spec is not None else teacher),  # type: ignore[arg-type]
        plan,
        ShardWriter(lambda i: R.shard_path(out, i), _shard_parquet),
        engine=engine_,
        resume=True,
        progress=Progress(
            lambda described: f"teacher {described['teacher']}", "pair", progress, source.num_pairs
        ),
        ray=ray,
        workers=workers,
        job_wrapper=job_wrapper,
    )
    identity = run_state["identity"]
    if not run.planned:
        done = run_state["done"]
        log.info("%s: already complete (%d pairs)", out, done["pairs"])
        return GenerateResult(out, done, 0, run_state["shards"])
    manifest = _manifest(out, source, identity, run.shards, run.engine, run_state["started"])
    R.write_json(out / R.MANIFEST, manifest)
    (out / R.STATE).unlink(missing_ok=True)
    return GenerateResult(out, manifest, run.scored, run.reused)


def _manifest(
    out: Path,
    source: PairSource,
    identity: dict[str, Any],
    shards: int,
    engine: Engine,
    started: float,
) -> dict[str, Any]:
    """The finished run's manifest, its rows counted and summarized from the shards written."""
    scores = R.read_rows_unchecked(out).column("score").to_numpy()
    if len(scores) != source.num_pairs:
        raise RuntimeError(f"{out}: {len(scores)} rows written, expected {source.num_pairs}")
    return {
        "identity": identity,
        "kind": "distill-teacher-rows",
        "queries": len(source.queries),
        "pairs": source.num_pairs,
        "shards": shards,
        "score_stats": {
            "mean": float(np.mean(scores)),
            "std": float(np.std(scores)),
            "min": float(np.min(scores)),
            "max": float(np.max(scores)),
        },
        "cisrank_version": __version__,
        "engine": engine.value,
        "seconds_this_run": round(time.perf_counter() - started, 3),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _shard_parquet(shard: int, table: Any) -> bytes:
    """A shard's rows (`TeacherShardJob.score`'s) as the bytes of its Parquet file."""
    return R.shard_bytes(table.select(R.SCHEMA.names).to_pydict())
