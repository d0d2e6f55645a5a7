"""`distill generate`: teacher scores for every (query, passage) pair of a source, as Parquet.

Safe to interrupt: shards are written whole, and a rerun with the same source and teacher skips
the shards that exist. A rerun with a different source or teacher refuses to mix the two unless
told to `overwrite`.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from cisrank import __version__
from cisrank.distill import rows as R
from cisrank.distill.sources import PairSource, QueryPairs
from cisrank.distill.teachers import Teacher
from cisrank.errors import DataError

log = logging.getLogger(__name__)


@dataclass
class GenerateResult:
    out: Path
    manifest: dict[str, Any]
    shards_written: int
    shards_reused: int


def shard_plan(source: PairSource, shard_pairs: int) -> list[list[QueryPairs]]:
    """Whole queries, cut into shards once a shard holds `shard_pairs` pairs or more. Fixed by the
    source alone, so a resumed run finds the same shard boundaries."""
    shards: list[list[QueryPairs]] = [[]]
    size = 0
    for q in source.queries:
        if size >= shard_pairs:
            shards.append([])
            size = 0
        shards[-1].append(q)
        size += len(q.docids)
    return shards


def _identity(source: PairSource, teacher: Teacher, shard_pairs: int) -> dict[str, Any]:
    identity = {
        "source": source.identity,
        "pairs_sha256": source.digest(),
        "teacher": teacher.describe(),
        "shard_pairs": shard_pairs,
    }
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


def generate(
    source: PairSource,
    teacher: Teacher,
    out: str | Path,
    *,
    shard_pairs: int = 2048,
    overwrite: bool = False,
    progress: bool = True,
) -> GenerateResult:
    if shard_pairs < 1:
        raise DataError(f"--shard-pairs must be >= 1, got {shard_pairs}")
    out = Path(out)
    identity = _identity(source, teacher, shard_pairs)
    done = _claim(out, identity, overwrite)
    chunks = shard_plan(source, shard_pairs)
    n_shards = len(chunks)
    if done is not None:
        log.info("%s: already complete (%d pairs)", out, done["pairs"])
        return GenerateResult(out, done, 0, n_shards)

    started = time.perf_counter()
    written = reused = 0
    todo = []
    for i, chunk in enumerate(chunks):
        expected = sum(len(q.docids) for q in chunk)
        if R.shard_rows(R.shard_path(out, i)) == expected:
            reused += 1
        else:
            todo.append(i)
    pending = set(todo)
    done_queries = sum(len(chunks[i]) for i in range(n_shards) if i not in pending)
    if reused:
        log.info("%s: resuming, %d of %d shards already written", out, reused, n_shards)
    with tqdm(
        total=len(source.queries),
        initial=done_queries,
        desc=f"teacher {identity['teacher']['teacher']}",
        unit="query",
        disable=not progress,
    ) as bar:
        for i in todo:
            cols: dict[str, list[Any]] = {f.name: [] for f in R.SCHEMA}
            for q in chunks[i]:
                got = teacher.score(q.qid, q.query, q.docids, q.passages)
                n = len(q.docids)
                if len(got.score) != n:
                    raise RuntimeError(f"teacher returned {len(got.score)} scores for {n} pairs")
                cols["qid"] += [q.qid] * n
                cols["docid"] += q.docids
                cols["query"] += [q.query] * n
                cols["passage"] += q.passages
                cols["rank"] += q.ranks
                cols["score"] += [float(v) for v in got.score]
                cols["log_conditional"] += got.log_conditional or [None] * n
                cols["log_prior"] += got.log_prior or [None] * n
                bar.update(1)
            R.write_shard(R.shard_path(out, i), cols)
            written += 1

    scores = R.read_rows_unchecked(out).column("score").to_numpy()
    manifest = {
        "identity": identity,
        "kind": "distill-teacher-rows",
        "queries": len(source.queries),
        "pairs": source.num_pairs,
        "shards": n_shards,
        "score_stats": {
            "mean": float(np.mean(scores)),
            "std": float(np.std(scores)),
            "min": float(np.min(scores)),
            "max": float(np.max(scores)),
        },
        "cisrank_version": __version__,
        "seconds_this_run": round(time.perf_counter() - started, 3),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if len(scores) != source.num_pairs:
        raise RuntimeError(f"{out}: {len(scores)} rows written, expected {source.num_pairs}")
    R.write_json(out / R.MANIFEST, manifest)
    (out / R.STATE).unlink(missing_ok=True)
    return GenerateResult(out, manifest, written, reused)
