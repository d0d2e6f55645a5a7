"""Dedupe, sort by length, batch, pad, scatter back: how every model-backed reranker batches.

Both the causal-LM engine (CIS) and the cross-encoder score many token sequences of mixed lengths
and must hand back one result per input, in input order. They do it the same way, here:

- identical inputs are scored once (`dedupe`, `scatter`): cheaper, and a passage asked for twice
  cannot get two scores from sitting in two differently padded batches;
- the distinct inputs are sorted by length, longest first, and cut into batches under one policy
  (`LengthBatcher`): a row count, a padded-token budget and a bound on each row's padding. Rows
  of near-equal length waste little compute on padding, and a fixed order (ties by input index)
  makes the batches, hence the scores, a function of the distinct inputs alone;
- each batch is padded by hand to its longest member (`pad_batch`), on either side.

Each engine keeps its own policy as parameters: the causal LM batches under a token budget with a
padding bound (padding is pure loss on a CPU), the cross-encoder by row count.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

H = TypeVar("H", bound=Hashable)
R = TypeVar("R")


def dedupe(items: Iterable[H]) -> tuple[list[H], list[int]]:
    """The distinct items in first-seen order, and each input's slot among them."""
    index: dict[H, int] = {}
    slots = [index.setdefault(item, len(index)) for item in items]
    return list(index), slots


def scatter(values: Sequence[R], slots: Sequence[int]) -> list[R]:
    """Per-distinct-item values back to one per input (the inverse of `dedupe`)."""
    return [values[s] for s in slots]


@dataclass(frozen=True, slots=True)
class LengthBatcher:
    """Cuts items, sorted longest first, into batches; a limit left None does not apply.

    Args:
        batch_size: at most this many rows per batch.
        batch_tokens: at most this many padded tokens per batch (rows x longest row).
        max_padding: the most padding a row may carry, as a fraction of the batch's width; a
            shorter item starts a new batch.
    """

    batch_size: int | None = None
    batch_tokens: int | None = None
    max_padding: float | None = None

    def __post_init__(self) -> None:
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.batch_tokens is not None and self.batch_tokens < 1:
            raise ValueError(f"batch_tokens must be >= 1, got {self.batch_tokens}")
        if self.max_padding is not None and not 0.0 <= self.max_padding < 1.0:
            raise ValueError(f"max_padding must be in [0, 1), got {self.max_padding}")

    def plan(self, lengths: Sequence[int]) -> list[list[int]]:
        """Indices of the items of positive length, longest first (ties by index), in batches.

        An item of length 0 needs no model call and is in no batch. A batch's first (longest)
        item sets its width; an item alone in its batch may exceed `batch_tokens`."""
        order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: (-lengths[i], i))
        batches: list[list[int]] = []
        cur: list[int] = []
        for i in order:
            width = lengths[cur[0]] if cur else lengths[i]
            full = self.batch_size is not None and len(cur) >= self.batch_size
            too_short = self.max_padding is not None and (
                width - lengths[i] > self.max_padding * width
            )
            over = self.batch_tokens is not None and (len(cur) + 1) * width > self.batch_tokens
            if cur and (full or too_short or over):
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
        return batches

    def run(
        self,
        lengths: Sequence[int],
        score: Callable[[list[int]], Sequence[R]],
        empty: R,
        lanes: Executor | None = None,
    ) -> list[R]:
        """One result per item: `score(batch)` gives one per index of each planned batch;
        items of length 0 get `empty`. With `lanes`, the batches are scored concurrently on
        its threads, longest first (a runtime that releases the GIL, as ONNX Runtime does)."""
        out: list[R] = [empty] * len(lengths)
        batches = self.plan(lengths)
        scored = lanes.map(score, batches) if lanes is not None else map(score, batches)
        for batch, values in zip(batches, scored, strict=True):
            if len(values) != len(batch):
                raise RuntimeError(f"batch of {len(batch)} rows gave {len(values)} results")
            for i, v in zip(batch, values, strict=True):
                out[i] = v
        return out


def pad_batch(
    seqs: Sequence[Sequence[int]], pad_value: int, *, left: bool = False
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Rows padded to the longest with `pad_value` (on the left if `left`): int64 ids [B, W],
    their 0/1 mask [B, W], and each row's offset of its first real token."""
    width = max((len(s) for s in seqs), default=0)
    ids = np.full((len(seqs), width), pad_value, dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=np.int64)
    offsets = []
    for r, s in enumerate(seqs):
        off = width - len(s) if left else 0
        ids[r, off : off + len(s)] = s
        mask[r, off : off + len(s)] = 1
        offsets.append(off)
    return ids, mask, offsets
