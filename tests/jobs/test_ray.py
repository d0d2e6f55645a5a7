"""The Ray engine's blocks, as the offline jobs build them (the jobs themselves: tests/indexes/
test_ray_jobs.py, tests/distill/test_ray_generate.py)."""

from __future__ import annotations

import pytest

from cisrank.jobs.ray import POS, SHARD, assemble_shards, text_block


def test_a_text_block_carries_its_shard_and_positions():
    block = text_block(7, ["x", "y", "z"])
    assert block.column_names == [SHARD, POS, "text"]
    assert block.to_pydict() == {SHARD: [7, 7, 7], POS: [0, 1, 2], "text": ["x", "y", "z"]}
    assert str(block.schema.field(SHARD).type) == str(block.schema.field(POS).type) == "int64"
    assert text_block(0, []).num_rows == 0


def _rows(shard: int, positions: list[int]):
    import pyarrow as pa

    return pa.table(
        {
            SHARD: pa.array([shard] * len(positions), pa.int64()),
            POS: pa.array(positions, pa.int64()),
            "score": pa.array([shard * 10.0 + p for p in positions]),
        }
    )


def _assembled(batches, expected):
    got: list[tuple[int, list[int], list[float]]] = []
    n = assemble_shards(
        batches,
        expected,
        lambda s, t: got.append((s, t.column(POS).to_pylist(), t.column("score").to_pylist())),
    )
    return n, got


def test_a_shard_is_handed_over_once_sorted_even_when_a_retry_sends_it_again():
    """Ray retries at least once: a block finished as its actor died comes back a second time
    (the rows of shard 0 below); the driver hands it over once, and a shard split across
    batches in any order is handed over when its last row arrives, in position order."""
    import pyarrow as pa

    mixed = pa.concat_tables([_rows(1, [2]), _rows(0, [1, 0])])  # a batch holding two shards
    batches = [_rows(0, [0, 1]), _rows(1, [1, 0]), _rows(0, [1, 0]), mixed, _rows(2, [])]
    n, got = _assembled(batches, {0: 2, 1: 3})
    assert n == 2
    assert got == [(0, [0, 1], [0.0, 1.0]), (1, [0, 1, 2], [10.0, 11.0, 12.0])]


def test_more_rows_than_a_pending_shard_has_or_a_shard_left_short_is_an_error():
    with pytest.raises(RuntimeError, match=r"shard 0: 3 result rows, expected 2"):
        _assembled([_rows(0, [0, 1, 2])], {0: 2})
    with pytest.raises(RuntimeError, match=r"shards \[1\] came back incomplete"):
        _assembled([_rows(0, [0, 1]), _rows(1, [0])], {0: 2, 1: 2})
