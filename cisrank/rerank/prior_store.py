"""The prior store: log p(K) computed once per passage and kept, content-addressed, in SQLite.

`log p(K)` depends only on the passage, the model and the tokenizer, so CIS computes it once (when a
corpus is indexed, or the first time an ad-hoc passage is seen) and reads it back afterwards. Entries
are keyed by

- a *fingerprint* of everything that changes the value (model weights identity, compute dtype,
  tokenizer, `max_doc_tokens`), so a changed model or tokenizer never reuses stale priors, and
- a hash of the passage's token ids (after truncation), so identical passages share one entry
  whatever their id or surrounding whitespace.

SQLite in WAL mode lets many processes (API workers, index build jobs) read while one writes;
writes are `INSERT OR IGNORE` in short transactions with a busy timeout, so concurrent writers never
lose an entry (a key always maps to the same value, so whichever write lands first is correct).
Each process opens its own connection (re-opened after a fork).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from cisrank.errors import CisrankError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS priors (
    fingerprint TEXT NOT NULL,
    passage_key TEXT NOT NULL,
    logprob REAL NOT NULL,
    num_tokens INTEGER NOT NULL,
    PRIMARY KEY (fingerprint, passage_key)
) WITHOUT ROWID
"""
_CHUNK = 500  # keys per SELECT ... IN (...), well under SQLite's variable limit


def passage_key(token_ids: Sequence[int]) -> str:
    """Content address of a passage: sha256 of its token ids as little-endian int64."""
    return hashlib.sha256(np.asarray(token_ids, dtype="<i8").tobytes()).hexdigest()


def store_fingerprint(engine_fingerprint: str, max_doc_tokens: int) -> str:
    """Fingerprint of one prior-store namespace: model + tokenizer identity and truncation."""
    return hashlib.sha256(
        f"{engine_fingerprint}|max_doc_tokens={max_doc_tokens}".encode()
    ).hexdigest()


class PriorStore:
    """Persistent `(fingerprint, passage_key) -> (log p(K), token count)` map, multi-process safe.

    `stats()` counts hits and misses of `get_many` in this object (the API exports the hit rate).
    """

    def __init__(self, path: str | Path, timeout_s: float = 60.0) -> None:
        self.path = Path(path).expanduser()
        if self.path.exists() and self.path.is_dir():
            raise CisrankError(f"prior store '{self.path}' is a folder: pass a file path (.sqlite)")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CisrankError(
                f"cannot create the folder of prior store '{self.path}': {exc}"
            ) from exc
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self.hits = 0
        self.misses = 0
        self._connect()

    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        try:
            conn = sqlite3.connect(
                self.path, timeout=self.timeout_s, check_same_thread=False, isolation_level=None
            )
            conn.execute(f"PRAGMA busy_timeout={int(self.timeout_s * 1000)}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise CisrankError(
                f"prior store '{self.path}' cannot be opened as SQLite ({exc}): "
                "pass a new file path or delete the damaged file"
            ) from exc
        self._conn, self._pid = conn, os.getpid()
        return conn

    def get_many(self, fingerprint: str, keys: Sequence[str]) -> dict[str, tuple[float, int]]:
        """Stored `(logprob, num_tokens)` for the keys present; counts hits and misses."""
        found: dict[str, tuple[float, int]] = {}
        distinct = list(dict.fromkeys(keys))
        with self._lock:
            conn = self._connect()
            for start in range(0, len(distinct), _CHUNK):
                part = distinct[start : start + _CHUNK]
                marks = ",".join("?" * len(part))
                rows = conn.execute(
                    "SELECT passage_key, logprob, num_tokens FROM priors "
                    f"WHERE fingerprint = ? AND passage_key IN ({marks})",
                    [fingerprint, *part],
                ).fetchall()
                for key, lp, n in rows:
                    found[key] = (float(lp), int(n))
            self.hits += sum(1 for k in keys if k in found)
            self.misses += sum(1 for k in keys if k not in found)
        return found

    def put_many(self, fingerprint: str, items: Iterable[tuple[str, float, int]]) -> int:
        """Store `(key, logprob, num_tokens)` entries in one transaction; returns rows written."""
        rows = [(fingerprint, k, float(lp), int(n)) for k, lp, n in items]
        if not rows:
            return 0
        with self._lock:
            conn = self._connect()
            conn.execute("BEGIN IMMEDIATE")
            try:
                before = conn.total_changes
                conn.executemany(
                    "INSERT OR IGNORE INTO priors (fingerprint, passage_key, logprob, num_tokens) "
                    "VALUES (?, ?, ?, ?)",
                    rows,
                )
                written = conn.total_changes - before
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return written

    def count(self, fingerprint: str | None = None) -> int:
        """Entries in the store, or under one fingerprint."""
        with self._lock:
            conn = self._connect()
            if fingerprint is None:
                return int(conn.execute("SELECT COUNT(*) FROM priors").fetchone()[0])
            return int(
                conn.execute(
                    "SELECT COUNT(*) FROM priors WHERE fingerprint = ?", (fingerprint,)
                ).fetchone()[0]
            )

    def stats(self) -> dict[str, int]:
        """Lookup counters of this object: {"hits": ..., "misses": ...}."""
        return {"hits": self.hits, "misses": self.misses}

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    def __len__(self) -> int:
        return self.count()

    def __repr__(self) -> str:
        return f"PriorStore({str(self.path)!r})"
