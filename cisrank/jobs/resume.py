"""Resumable shard jobs: what a rerun of an interrupted job keeps.

The offline jobs that score a corpus or a pair source in shards (the dense build and the prior job
in `cisrank.indexes`, teacher scoring in `cisrank.distill`) each write one file per shard, in a
format of their own, temp file and rename, so a shard file that exists and checks out is
complete. Resuming is the same two steps for all of them:

- `claim_shard_dir`: a shard folder holds the shards of one build, named by its `meta.json`; a
  rerun with other meta (or without `resume`) discards them and starts clean.
- `resume_shards`: the job's shards, in order, split into those whose file is complete (kept) and
  those still to score (with the rows each must give back).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from cisrank.data.datasets import guarded_json
from cisrank.errors import DataError
from cisrank.fileio import atomic_write_text

log = logging.getLogger(__name__)

T = TypeVar("T")

META_FILE = "meta.json"


def claim_shard_dir(
    shard_dir: Path, meta: Mapping[str, Any], *, resume: bool, logger: logging.Logger = log
) -> None:
    """Make `shard_dir` the shard folder of the build `meta` describes: its shards are kept when
    `resume` is set and its `meta.json` equals `meta`, else they are discarded (logged on
    `logger`). `meta` is written (as JSON, keys sorted) either way."""
    meta_path = shard_dir / META_FILE
    if shard_dir.exists():
        same = resume and meta_path.is_file() and _read_meta(meta_path) == meta
        if not same:
            logger.info("%s: discarding shards of a different build", shard_dir)
            shutil.rmtree(shard_dir)
    shard_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(meta_path, json.dumps(meta, sort_keys=True))


@dataclass(frozen=True)
class ShardResume(Generic[T]):
    """A job's shards after the resume check."""

    sizes: tuple[int, ...]
    """Rows of every shard, in shard order."""
    todo: tuple[tuple[int, T], ...]
    """The shards to score, as (index, shard), in shard order."""

    @property
    def shards(self) -> int:
        return len(self.sizes)

    @property
    def reused(self) -> int:
        """Shards whose file is complete: not scored again."""
        return len(self.sizes) - len(self.todo)

    @property
    def rows(self) -> int:
        return sum(self.sizes)

    @property
    def expected(self) -> dict[int, int]:
        """Rows each shard to score must give back, by index."""
        return {i: self.sizes[i] for i, _ in self.todo}

    @property
    def done_rows(self) -> int:
        """Rows of the kept shards (where a progress bar starts)."""
        return self.rows - sum(self.expected.values())


def resume_shards(
    shards: Iterable[T], rows: Callable[[T], int], complete: Callable[[int, int], bool]
) -> ShardResume[T]:
    """Split `shards` (in order, iterated once: a generator streams) into those a rerun keeps,
    where `complete(index, rows(shard))` says shard `index`'s file holds all its rows, and those
    still to score, kept with their index."""
    sizes: list[int] = []
    todo: list[tuple[int, T]] = []
    for index, shard in enumerate(shards):
        n = rows(shard)
        sizes.append(n)
        if not complete(index, n):
            todo.append((index, shard))
    return ShardResume(tuple(sizes), tuple(todo))


def _read_meta(path: Path) -> Any:
    """A shard folder's `meta.json`, or None where it is not readable JSON (a torn or damaged
    one: the shards are discarded and made again)."""
    try:
        return guarded_json(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, DataError):
        return None
