"""The document store built with every index: passage text by row number or by id, on disk.

One SQLite file (`docs.sqlite`): row `idx` is the passage's position in the corpus, which is the
internal document number of bm25s and FAISS, so a hit's text is one primary-key lookup. SQLite
because it is in the standard library, opens instantly at any size, needs no RAM for the texts,
and is safe to read from several threads (the API) behind one lock.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from cisrank.errors import DamagedFileError, DataError

DOCSTORE_FILE = "docs.sqlite"


class DocStoreWriter:
    """Appends (docid, text) rows in corpus order to a temp file; `close()` publishes it.

    Used as a context manager: on an exception the partial file is removed, never published.
    """

    def __init__(self, path: str | Path, batch: int = 10_000) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".partial")
        self.tmp.unlink(missing_ok=True)
        self.batch = batch
        self.count = 0
        self._chunk: list[tuple[int, str, str]] = []
        self._con = sqlite3.connect(self.tmp)
        self._con.execute("PRAGMA journal_mode=OFF")
        self._con.execute("PRAGMA synchronous=OFF")
        self._con.execute(
            "CREATE TABLE docs (idx INTEGER PRIMARY KEY, docid TEXT NOT NULL, text TEXT)"
        )

    def add(self, docid: str, text: str) -> None:
        self._chunk.append((self.count, docid, text))
        self.count += 1
        if len(self._chunk) >= self.batch:
            self._flush()

    def _flush(self) -> None:
        self._con.executemany("INSERT INTO docs VALUES (?, ?, ?)", self._chunk)
        self._chunk.clear()

    def close(self) -> int:
        self._flush()
        self._con.execute("CREATE UNIQUE INDEX docs_docid ON docs (docid)")
        self._con.commit()
        self._con.close()
        self.tmp.replace(self.path)
        return self.count

    def abort(self) -> None:
        self._con.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> DocStoreWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_docstore(path: Path, rows: Iterable[tuple[str, str]], batch: int = 10_000) -> int:
    """Write (docid, text) rows in order to a fresh SQLite file via a temp name; returns count."""
    with DocStoreWriter(path, batch) as writer:
        for docid, text in rows:
            writer.add(docid, text)
    return writer.count


class DocStore:
    """Read side: `get(indices)` and `by_docid(docids)`; missing entries raise, never guess."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise DataError(f"document store '{self.path}' is missing: rebuild the index")
        self._lock = threading.Lock()
        try:
            self._con = sqlite3.connect(
                f"file:{self.path}?mode=ro", uri=True, check_same_thread=False
            )
            (self._size,) = self._con.execute("SELECT COUNT(*) FROM docs").fetchone()
        except sqlite3.Error as exc:
            raise DamagedFileError(self.path, f"SQLite cannot read it: {exc}") from None

    def __len__(self) -> int:
        return self._size

    def _fetch(self, column: str, keys: Sequence) -> dict:
        out: dict = {}
        with self._lock:
            try:
                for start in range(0, len(keys), 900):  # SQLite's host-parameter limit
                    part = list(keys[start : start + 900])
                    marks = ",".join("?" * len(part))
                    sql = f"SELECT {column}, idx, docid, text FROM docs WHERE {column} IN ({marks})"
                    for key, idx, docid, text in self._con.execute(sql, part):
                        out[key] = (idx, docid, text)
            except sqlite3.Error as exc:  # malformed pages, undecodable text
                raise DamagedFileError(self.path, f"SQLite cannot read it: {exc}") from None
        return out

    def get(self, indices: Sequence[int]) -> list[tuple[str, str]]:
        """(docid, text) for internal row numbers, in the order given."""
        keys = [int(i) for i in indices]
        found = self._fetch("idx", keys)
        missing = [i for i in keys if i not in found]
        if missing:
            raise DamagedFileError(self.path, f"rows {missing[:5]} missing")
        return [found[i][1:] for i in keys]

    def by_docid(self, docids: Sequence[str]) -> list[str]:
        """Texts for passage ids, in the order given."""
        found = self._fetch("docid", list(docids))
        missing = [d for d in docids if d not in found]
        if missing:
            raise DataError(f"{self.path}: passage ids {missing[:5]} not in the document store")
        return [found[d][2] for d in docids]

    def close(self) -> None:
        self._con.close()
