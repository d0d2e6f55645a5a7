"""The prior table: log p(K) of a whole corpus as one read-only Parquet file, shared by readers.

The SQLite prior store (`prior_store.PriorStore`) is a cache that grows: a CIS reranker writes the
priors of every passage it has not seen. At corpus scale (8.8M MS MARCO passages) the priors are
computed once, by the offline job on a cluster (`cisrank index build prior --engine ray`), and
every API replica reads the same file: a columnar table, keyed like the SQLite store.

Columns: `fingerprint` (the store namespace: model, tokenizer, dtype, `max_doc_tokens`),
`passage_key` (sha256 hex of the truncated token ids), `logprob` (summed log p(K)), `num_tokens`
and `checksum` (the SQLite store's row CRC32 of the four). Rows are sorted by key and unique, so
a reader keeps four numpy arrays (about 44 bytes a passage: 390 MB for MS MARCO) and looks keys
up by binary search. Integrity: Parquet page checksums are written and verified on read, each
row returned is checked against its CRC32, and a prior index folder's manifest records the file's
sha256 blocks (checked when the folder is opened).

`open_prior_store(spec)` is what `--prior-store` and the API's `prior_store` option go through: a
`.sqlite` file (the store, as before), a `.parquet` table, a prior index folder (its table or its
store), or several of them comma-separated, looked up in order (`TieredPriors`): tables first, a
SQLite file last to cache the ad-hoc passages the tables do not hold (without one, those are
kept in memory).
"""

from __future__ import annotations

import binascii
import logging
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from cisrank.errors import CisrankError, DamagedFileError, DataError, require
from cisrank.rerank.prior_store import PriorStore, row_checksum

log = logging.getLogger(__name__)

TABLE_FILE = "priors.parquet"
STORE_FILE = "priors.sqlite"
COLUMNS = ("fingerprint", "passage_key", "logprob", "num_tokens", "checksum")
_MEMORY_MAX = 200_000


class Priors(Protocol):
    """What the CIS reranker needs of a place that keeps log p(K) (store, table or tiers)."""

    path: Path
    hits: int
    misses: int

    def get_many(self, fingerprint: str, keys: Sequence[str]) -> dict[str, tuple[float, int]]: ...

    def put_many(self, fingerprint: str, items: Iterable[tuple[str, float, int]]) -> int: ...

    def count(self, fingerprint: str | None = None) -> int: ...

    def stats(self) -> dict[str, int]: ...

    def close(self) -> None: ...


def _pa():
    return require("pyarrow", "ray", "the Parquet prior table")


def table_schema():
    pa = _pa()
    return pa.schema(
        [
            ("fingerprint", pa.string()),
            ("passage_key", pa.string()),
            ("logprob", pa.float64()),
            ("num_tokens", pa.int64()),
            ("checksum", pa.int64()),
        ]
    )


def prior_rows(fingerprint: str, items: Iterable[tuple[str, float, int]]) -> dict[str, list[Any]]:
    """Columns of table rows for `(key, logprob, num_tokens)` items, each with its CRC32."""
    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    for key, lp, n in items:
        cols["fingerprint"].append(fingerprint)
        cols["passage_key"].append(key)
        cols["logprob"].append(float(lp))
        cols["num_tokens"].append(int(n))
        cols["checksum"].append(row_checksum(fingerprint, key, lp, n))
    return cols


def write_prior_table(path: Path, table) -> int:
    """Write `table` (the prior columns) as the final, sorted, de-duplicated Parquet file:
    the first row of each (fingerprint, key) wins (a key always maps to one value). Written to a
    temp name and renamed: a file at `path` is complete. Returns the rows written."""
    import pyarrow.parquet as pq

    from cisrank.fileio import atomic_write_bytes

    pa = _pa()
    table = table.select(list(COLUMNS)).cast(table_schema())
    if table.num_rows:
        index = pa.array(np.arange(table.num_rows, dtype=np.int64))
        keyed = table.append_column("_row", index)
        first = keyed.group_by(["fingerprint", "passage_key"], use_threads=False).aggregate(
            [("_row", "min")]
        )
        table = table.take(first.column("_row_min"))
        table = table.sort_by([("fingerprint", "ascending"), ("passage_key", "ascending")])
    sink = pa.BufferOutputStream()
    pq.write_table(
        table,
        sink,
        compression="zstd",
        write_page_checksum=True,
        use_dictionary=["fingerprint"],
        row_group_size=1 << 20,
    )
    atomic_write_bytes(path, sink.getvalue().to_pybytes())
    return table.num_rows


def _key_bytes(hex_keys) -> np.ndarray:
    """Hex passage keys (a pyarrow string column) as a numpy array of 32-byte digests, chunk by
    chunk (one string array holds at most 2 GB: 33M keys)."""
    parts = [np.empty(0, dtype="S32")]
    chunks = hex_keys.chunks if hasattr(hex_keys, "chunks") else [hex_keys]
    for chunk in chunks:
        n = len(chunk)
        if n == 0:
            continue
        offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int32)[
            chunk.offset : chunk.offset + n + 1
        ]
        if not np.all(np.diff(offsets) == 64):
            raise ValueError("passage keys are not 64 hex digits")
        data = chunk.buffers()[2].to_pybytes()[offsets[0] : offsets[-1]]
        parts.append(np.frombuffer(binascii.unhexlify(data), dtype="S32"))
    return np.concatenate(parts)


class PriorTable:
    """A read-only Parquet prior table, held as sorted numpy arrays and searched by key.

    `put_many` stores nothing (returns 0): the table is the output of a build. Look-ups count
    `hits` and `misses` like the SQLite store (the API exports the hit rate).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise DataError(f"prior table '{self.path}' does not exist")
        pa = _pa()
        pc = require("pyarrow.compute", "ray", "the Parquet prior table")
        pq = require("pyarrow.parquet", "ray", "the Parquet prior table")
        try:
            table = pq.read_table(self.path, page_checksum_verification=True)
            missing = [c for c in COLUMNS if c not in table.column_names]
            if missing:
                raise DataError(
                    f"'{self.path}' is not a prior table: no column(s) {', '.join(missing)}"
                )
            fps = table.column("fingerprint").unique().to_pylist()
            self._by_fp: dict[str, tuple[np.ndarray, ...]] = {}
            for fp in fps:
                part = table.filter(pc.equal(table.column("fingerprint"), fp))
                keys = _key_bytes(part.column("passage_key"))
                lps = part.column("logprob").to_numpy()
                ns = part.column("num_tokens").to_numpy()
                crcs = part.column("checksum").to_numpy()
                if keys.size > 1 and not bool(np.all(keys[1:] > keys[:-1])):
                    order = np.argsort(keys, kind="stable")
                    keys, lps, ns, crcs = keys[order], lps[order], ns[order], crcs[order]
                    dup = keys[1:] == keys[:-1]
                    if dup.any():
                        keep = np.concatenate([[True], ~dup])
                        keys, lps, ns, crcs = keys[keep], lps[keep], ns[keep], crcs[keep]
                self._by_fp[str(fp)] = (keys, lps, ns, crcs)
        except DataError:
            raise
        except (OSError, ValueError, pa.ArrowException) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DamagedFileError(
                self.path, f"it cannot be read as a prior table: {first}"
            ) from None
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def get_many(self, fingerprint: str, keys: Sequence[str]) -> dict[str, tuple[float, int]]:
        found: dict[str, tuple[float, int]] = {}
        arrays = self._by_fp.get(fingerprint)
        if arrays is None:
            if self._by_fp and fingerprint not in self._warned:
                self._warned.add(fingerprint)
                log.warning(
                    "%s holds no priors of this model (store fingerprint %s...): they are computed",
                    self.path,
                    fingerprint[:16],
                )
        elif keys:
            table_keys, lps, ns, crcs = arrays
            distinct = list(dict.fromkeys(keys))
            want = np.frombuffer(binascii.unhexlify("".join(distinct)), dtype="S32")
            pos = np.searchsorted(table_keys, want)
            pos_ok = np.minimum(pos, max(table_keys.size - 1, 0))
            hit = (pos < table_keys.size) & (table_keys[pos_ok] == want) if table_keys.size else []
            for key, i, ok in zip(distinct, pos_ok, hit, strict=False):
                if not ok:
                    continue
                lp, n, crc = float(lps[i]), int(ns[i]), int(crcs[i])
                if row_checksum(fingerprint, key, lp, n) != crc:
                    raise DamagedFileError(
                        self.path, f"the stored prior of passage {key[:16]} fails its row checksum"
                    )
                found[key] = (lp, n)
        with self._lock:
            self.hits += sum(1 for k in keys if k in found)
            self.misses += sum(1 for k in keys if k not in found)
        return found

    def put_many(self, fingerprint: str, items: Iterable[tuple[str, float, int]]) -> int:
        return 0  # read-only: the passages a table lacks are cached by the tier after it

    def count(self, fingerprint: str | None = None) -> int:
        if fingerprint is None:
            return sum(a[0].size for a in self._by_fp.values())
        arrays = self._by_fp.get(fingerprint)
        return 0 if arrays is None else int(arrays[0].size)

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses}

    def close(self) -> None:
        pass

    def __len__(self) -> int:
        return self.count()

    def __repr__(self) -> str:
        return f"PriorTable({str(self.path)!r})"


class _MemoryPriors:
    """The last tier when no SQLite file is given: the passages no table holds, in memory."""

    def __init__(self) -> None:
        self.path = Path("<memory>")
        self.hits = self.misses = 0
        self._data: dict[tuple[str, str], tuple[float, int]] = {}

    def get_many(self, fingerprint: str, keys: Sequence[str]) -> dict[str, tuple[float, int]]:
        found = {k: self._data[(fingerprint, k)] for k in keys if (fingerprint, k) in self._data}
        self.hits += sum(1 for k in keys if k in found)
        self.misses += sum(1 for k in keys if k not in found)
        return found

    def put_many(self, fingerprint: str, items: Iterable[tuple[str, float, int]]) -> int:
        rows = list(items)
        if len(self._data) + len(rows) > _MEMORY_MAX:
            self._data.clear()
        for k, lp, n in rows:
            self._data[(fingerprint, k)] = (float(lp), int(n))
        return len(rows)

    def count(self, fingerprint: str | None = None) -> int:
        return sum(1 for fp, _ in self._data if fingerprint in (None, fp))

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses}

    def close(self) -> None:
        self._data.clear()


class TieredPriors:
    """Read-only tables first, then one writable tier (a SQLite store, or memory) that caches
    the passages no table holds. Hits and misses count the tiers together: a hit is a prior
    found in any tier."""

    def __init__(self, tables: Sequence[PriorTable], cache: PriorStore | None = None) -> None:
        self.tables = list(tables)
        self.cache: Any = cache if cache is not None else _MemoryPriors()
        self.path = self.tables[0].path if self.tables else self.cache.path
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()

    def get_many(self, fingerprint: str, keys: Sequence[str]) -> dict[str, tuple[float, int]]:
        found: dict[str, tuple[float, int]] = {}
        left = list(keys)
        for tier in [*self.tables, self.cache]:
            if not left:
                break
            found.update(tier.get_many(fingerprint, left))
            left = [k for k in left if k not in found]
        with self._lock:
            self.hits += sum(1 for k in keys if k in found)
            self.misses += sum(1 for k in keys if k not in found)
        return found

    def put_many(self, fingerprint: str, items: Iterable[tuple[str, float, int]]) -> int:
        return self.cache.put_many(fingerprint, items)

    def count(self, fingerprint: str | None = None) -> int:
        return sum(t.count(fingerprint) for t in self.tables) + self.cache.count(fingerprint)

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses}

    def close(self) -> None:
        self.cache.close()

    def __repr__(self) -> str:
        return f"TieredPriors({self.tables!r}, cache={self.cache!r})"


def _folder_parts(folder: Path) -> list[Path]:
    """The prior file(s) of a prior index folder, checked against its manifest."""
    from cisrank.data.manifest import read_manifest, verify_files

    manifest = read_manifest(folder)
    if manifest.kind != "prior":
        raise CisrankError(f"'{folder}' is a {manifest.kind} index, not a prior index")
    verify_files(folder, manifest)  # the store (mutable) is judged by its row checksums
    parts = [folder / f for f in manifest.files if f in (TABLE_FILE, STORE_FILE)]
    if not parts:
        raise CisrankError(f"prior index '{folder}' holds neither {TABLE_FILE} nor {STORE_FILE}")
    return parts


def open_prior_store(spec: str | Path) -> PriorStore | PriorTable | TieredPriors:
    """The priors `--prior-store` names: a SQLite file, a Parquet table, a prior index folder,
    or several comma-separated (tables, then at most one SQLite file, last)."""
    items = [s.strip() for s in str(spec).split(",") if s.strip()]
    if not items:
        raise CisrankError("--prior-store is empty")
    paths: list[Path] = []
    for item in items:
        path = Path(item).expanduser()
        paths += _folder_parts(path) if path.is_dir() else [path]
    tables = [PriorTable(p) for p in paths if p.suffix == ".parquet"]
    stores = [p for p in paths if p.suffix != ".parquet"]
    if len(stores) > 1:
        raise CisrankError(
            f"--prior-store names {len(stores)} SQLite stores ({', '.join(map(str, stores))}): "
            "give at most one, after the Parquet tables"
        )
    for store in stores:
        # the SQLite store is a cache created on first use, but only in a folder that exists:
        # a mistyped path must not leave a tree of empty folders behind
        if not store.exists() and not store.parent.is_dir():
            raise CisrankError(
                f"prior store '{store}': its folder {store.parent} does not exist: fix the path, "
                "or create the folder for a new store"
            )
    if not tables:
        return PriorStore(stores[0])
    cache = PriorStore(stores[0]) if stores else None
    return TieredPriors(tables, cache)
