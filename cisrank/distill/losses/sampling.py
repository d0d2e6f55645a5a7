"""Length-grouped batches: the sampler of the pair losses (MSE, margin-MSE)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any


def length_grouped_batches(
    lengths: Sequence[int], batch_size: int, seed: int, mega: int = 50
) -> list[list[int]]:
    """Shuffled batches of similar lengths: shuffle, sort within windows of `mega` batches,
    cut, shuffle the batches. Padding falls to a fraction while batches stay random in order and
    in which examples meet (the trick of HF's LengthGroupedSampler)."""
    rng = random.Random(seed)
    idx = list(range(len(lengths)))
    rng.shuffle(idx)
    window = batch_size * mega
    batches = []
    for start in range(0, len(idx), window):
        chunk = sorted(idx[start : start + window], key=lambda i: lengths[i])
        batches += [chunk[k : k + batch_size] for k in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def length_grouped_sampler(lengths: list[int]) -> type:
    """A sentence-transformers batch sampler class that yields `length_grouped_batches` of the
    training set's rows, reshuffled every epoch."""
    from sentence_transformers.base.sampler import DefaultBatchSampler

    class LengthGroupedBatchSampler(DefaultBatchSampler):
        epoch = 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __iter__(self) -> Any:
            yield from length_grouped_batches(lengths, self.batch_size, self.seed + self.epoch)

        def __len__(self) -> int:
            return -(-len(lengths) // self.batch_size)

    return LengthGroupedBatchSampler
