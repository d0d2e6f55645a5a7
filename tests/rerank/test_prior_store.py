"""The prior store: round trips, namespaces, counters, persistence and concurrent writers."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import sqlite3
import struct

import pytest

from cisrank.errors import CisrankError, DamagedFileError
from cisrank.rerank.prior_store import PriorStore, passage_key, store_fingerprint


def test_passage_key_is_sha256_of_int64_ids():
    expected = hashlib.sha256(struct.pack("<3q", 5, 0, 70000)).hexdigest()
    assert passage_key([5, 0, 70000]) == expected
    assert passage_key([5, 0]) != passage_key([0, 5])


def test_roundtrip_counters_and_namespaces(tmp_path):
    store = PriorStore(tmp_path / "p.sqlite")
    assert store.put_many("fpA", [("k1", -1.5, 3), ("k2", -7.25, 9)]) == 2
    assert store.put_many("fpA", [("k1", -99.0, 1)]) == 0  # first write wins, never overwritten
    got = store.get_many("fpA", ["k1", "k3", "k2", "k1"])
    assert got == {"k1": (-1.5, 3), "k2": (-7.25, 9)}
    assert store.stats() == {"hits": 3, "misses": 1}
    assert store.get_many("fpB", ["k1"]) == {}  # another model's namespace
    assert store.stats() == {"hits": 3, "misses": 2}
    assert store.count() == 2 and store.count("fpA") == 2 and store.count("fpB") == 0
    store.close()
    again = PriorStore(tmp_path / "p.sqlite")
    assert again.get_many("fpA", ["k2"]) == {"k2": (-7.25, 9)}
    mode = sqlite3.connect(tmp_path / "p.sqlite").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_many_keys_are_chunked(tmp_path):
    store = PriorStore(tmp_path / "p.sqlite")
    items = [(f"k{i}", -float(i), i) for i in range(1800)]
    store.put_many("fp", items)
    got = store.get_many("fp", [k for k, _, _ in items])
    assert len(got) == 1800 and got["k1234"] == (-1234.0, 1234)


def test_store_fingerprint_depends_on_max_doc_tokens():
    assert store_fingerprint("e", 512) != store_fingerprint("e", 256)
    assert store_fingerprint("e", 512) == store_fingerprint("e", 512)


def test_bad_paths_are_clean_errors(tmp_path):
    with pytest.raises(CisrankError, match="is a folder"):
        PriorStore(tmp_path)
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(CisrankError, match="cannot be opened as SQLite"):
        PriorStore(bad)


def _writer(path: str, worker: int, n: int) -> None:
    store = PriorStore(path)
    for start in range(0, n, 25):
        # each worker writes its own keys and a shared range that every worker also writes
        own = [(f"w{worker}-{i}", -float(i), worker) for i in range(start, start + 25)]
        shared = [(f"shared-{i}", -0.5 * i, 1) for i in range(start, start + 25)]
        store.put_many("fp", own + shared)
        store.get_many("fp", [k for k, _, _ in shared])
    store.close()


def test_concurrent_processes_lose_nothing(tmp_path):
    path = str(tmp_path / "p.sqlite")
    PriorStore(path).close()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, w, 200)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    store = PriorStore(path)
    assert store.count("fp") == 4 * 200 + 200
    got = store.get_many("fp", [f"w3-{i}" for i in range(200)] + ["shared-199"])
    assert got["w3-150"] == (-150.0, 3) and got["shared-199"] == (-99.5, 1)
    assert len(got) == 201


def _flip_stored_value(path, value: float) -> None:
    """Flip the lowest mantissa bit of `value` where SQLite stores it (8 big-endian bytes)."""
    data = bytearray(path.read_bytes())
    at = data.find(struct.pack(">d", value))
    assert at > 0
    data[at + 7] ^= 0x01
    path.write_bytes(bytes(data))


def test_one_flipped_bit_in_a_stored_value_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "p.sqlite"
    store = PriorStore(path)
    store.put_many("fp", [("k1", -12.345678, 7), ("k2", -3.25, 2)])
    store.close()
    _flip_stored_value(path, -12.345678)
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"  # SQLite sees nothing
    con.close()
    store = PriorStore(path)
    assert store.get_many("fp", ["k2"]) == {"k2": (-3.25, 2)}  # intact rows still read
    with pytest.raises(DamagedFileError, match=r"p\.sqlite: damaged file .*row checksum") as err:
        store.get_many("fp", ["k1", "k2"])
    assert err.value.path == str(path)
    rows, unverified, problems = store.verify()
    assert (rows, unverified, len(problems)) == (1, 0, 1)


def test_a_store_from_before_row_checksums_is_read_unverified_with_a_warning(tmp_path, caplog):
    path = tmp_path / "old.sqlite"
    con = sqlite3.connect(path)
    con.execute(
        "CREATE TABLE priors (fingerprint TEXT NOT NULL, passage_key TEXT NOT NULL, "
        "logprob REAL NOT NULL, num_tokens INTEGER NOT NULL, "
        "PRIMARY KEY (fingerprint, passage_key)) WITHOUT ROWID"
    )
    con.execute("INSERT INTO priors VALUES ('fp', 'old', -1.5, 3)")
    con.commit()
    con.close()
    with caplog.at_level("WARNING", logger="cisrank.rerank.prior_store"):
        store = PriorStore(path)
        assert store.get_many("fp", ["old"]) == {"old": (-1.5, 3)}
    assert "before row checksums are read unverified" in caplog.text
    store.put_many("fp", [("new", -2.5, 4)])  # new rows get their checksum
    assert store.verify() == (1, 1, [])
