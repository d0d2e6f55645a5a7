"""The Parquet prior table on its own: one row per key (first wins), sorted, several namespaces,
read-only, and `open_prior_store`'s forms of `--prior-store`."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cisrank.errors import CisrankError
from cisrank.rerank.prior_store import PriorStore
from cisrank.rerank.prior_table import (
    PriorTable,
    TieredPriors,
    open_prior_store,
    prior_rows,
    table_schema,
    write_prior_table,
)

ROWS = [(hashlib.sha256(str(i).encode()).hexdigest(), -0.5 * i, i % 7 + 1) for i in range(3000)]


@pytest.fixture
def table_path(tmp_path):
    first = pa.table(prior_rows("fp", ROWS[:2000]), schema=table_schema())
    # overlapping keys with other values: the first row of a key wins
    again = pa.table(prior_rows("fp", [(k, 1.0, 1) for k, _, _ in ROWS[1500:]]), table_schema())
    other = pa.table(prior_rows("other", ROWS[:10]), schema=table_schema())
    path = tmp_path / "priors.parquet"
    assert write_prior_table(path, pa.concat_tables([first, again, other])) == 3010
    return path


def test_rows_unique_sorted_and_first_value_kept(table_path):
    t = pq.read_table(table_path).to_pydict()
    pairs = list(zip(t["fingerprint"], t["passage_key"], strict=True))
    assert pairs == sorted(set(pairs))
    table = PriorTable(table_path)
    assert table.count("fp") == 3000 and table.count("other") == 10 and len(table) == 3010
    keys = [k for k, _, _ in ROWS[::37]] + ["0" * 64]
    got = table.get_many("fp", keys)
    assert got == {k: (lp, n) for k, lp, n in ROWS[:1500][::37]} | {
        k: (1.0, 1) if i >= 2000 else (lp, n)
        for i, (k, lp, n) in enumerate(ROWS)
        if i >= 1500 and i % 37 == 0
    }
    assert table.stats() == {"hits": len(keys) - 1, "misses": 1}
    assert table.get_many("unknown-model", keys) == {}
    assert table.put_many("fp", [("a" * 64, 0.0, 1)]) == 0  # read-only


def test_open_prior_store_forms(table_path, tmp_path):
    store = open_prior_store(tmp_path / "cache.sqlite")
    assert isinstance(store, PriorStore)
    tiers = open_prior_store(f"{table_path},{tmp_path / 'cache.sqlite'}")
    assert isinstance(tiers, TieredPriors) and isinstance(tiers.cache, PriorStore)
    key = ROWS[0][0]
    assert tiers.get_many("fp", [key, "b" * 64]) == {key: (ROWS[0][1], ROWS[0][2])}
    tiers.put_many("fp", [("b" * 64, -3.0, 2)])  # cached in the SQLite file, not the table
    assert PriorStore(tmp_path / "cache.sqlite").get_many("fp", ["b" * 64]) == {"b" * 64: (-3.0, 2)}
    assert tiers.stats() == {"hits": 1, "misses": 1}
    with pytest.raises(CisrankError, match="at most one"):
        open_prior_store(f"{tmp_path / 'a.sqlite'},{tmp_path / 'b.sqlite'}")
    with pytest.raises(CisrankError, match="does not exist"):
        open_prior_store(tmp_path / "missing.parquet")


def test_a_store_in_a_folder_that_does_not_exist_is_refused_and_nothing_created(
    tmp_path, tiny_gpt2_dir
):
    """`load_reranker("cis", prior_store="/missing/x")` created the folder path of the mistyped
    store. Now one line naming the folder, and nothing is made; a new store in a folder that exists
    is still created on first use."""
    missing = tmp_path / "missing" / "deeper"
    for spec in (missing / "x", f"{missing / 'priors.sqlite'}"):
        with pytest.raises(CisrankError, match=f"its folder {missing} does not exist"):
            open_prior_store(spec)
    from cisrank.rerank.registry import load_reranker

    with pytest.raises(CisrankError, match="does not exist: fix the path"):
        load_reranker("cis", model=str(tiny_gpt2_dir), prior_store=str(missing / "x"))
    assert not (tmp_path / "missing").exists()
    assert isinstance(open_prior_store(tmp_path / "x"), PriorStore) and (tmp_path / "x").is_file()
