"""The Ray engine's blocks, as the offline jobs build them (the jobs themselves: tests/indexes/
test_ray_jobs.py, tests/distill/test_ray_generate.py)."""

from __future__ import annotations

from cisrank.jobs.ray import POS, SHARD, text_block


def test_a_text_block_carries_its_shard_and_positions():
    block = text_block(7, ["x", "y", "z"])
    assert block.column_names == [SHARD, POS, "text"]
    assert block.to_pydict() == {SHARD: [7, 7, 7], POS: [0, 1, 2], "text": ["x", "y", "z"]}
    assert str(block.schema.field(SHARD).type) == str(block.schema.field(POS).type) == "int64"
    assert text_block(0, []).num_rows == 0
