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

Integrity: SQLite's page structure survives a flipped bit inside a stored value, and its own
checks pass, so each row carries a CRC32 of (fingerprint, key, log p(K), token count). A read
checks it and a mismatch is a `DamagedFileError` naming the file, never a score; CRC32 detects
every single-bit flip and every burst up to 32 bits. Rows of a store written before the column
existed have no checksum: they are read as unverified, with one warning per store.
`verify()` checks every row and SQLite's own `integrity_check` (`cisrank index verify`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import struct
import threading
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from cisrank.errors import CisrankError, DamagedFileError

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS priors (
    fingerprint TEXT NOT NULL,
    passage_key TEXT NOT NULL,
    logprob REAL NOT NULL,
    num_tokens INTEGER NOT NULL,
    checksum INTEGER,
    PRIMARY KEY (fingerprint, passage_key)
) WITHOUT ROWID
"""
_CHUNK = 500  # keys per SELECT ... IN (...), well under SQLite's variable limit
_DAMAGE_CODES = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB


def row_checksum(fingerprint: str, key: str, logprob: float, num_tokens: int) -> int:
    """CRC32 of one stored row: its namespace, its key and both values, as written."""
    head = f"{fingerprint}\x00{key}\x00".encode()
    # + 0.0 turns -0.0 into 0.0: SQLite stores a whole-number REAL as an integer, sign lost
    return zlib.crc32(head + struct.pack("<dq", float(logprob) + 0.0, int(num_tokens)))


def _is_damage(exc: sqlite3.Error) -> bool:
    """SQLite found the file corrupt (not locked, full or unreachable: those are not damage)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _DAMAGE_CODES
    return type(exc) is sqlite3.DatabaseError


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
        self.checked = True  # False for a store whose table predates checksums and is read-only
        self._warned_unverified = False
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
            columns = {row[1] for row in conn.execute("PRAGMA table_info(priors)")}
            if "checksum" not in columns:
                self._migrate(conn)
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc, "it cannot be opened as SQLite") from None
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """A store written before rows had checksums: add the column, so new rows get one; the
        old rows stay unverified (a checksum computed now would vouch for unknown values)."""
        try:
            conn.execute("ALTER TABLE priors ADD COLUMN checksum INTEGER")
        except sqlite3.OperationalError as exc:  # read-only file or folder
            self.checked = False
            log.warning("%s: predates row checksums and cannot be upgraded (%s)", self.path, exc)
            return
        log.warning(
            "%s: priors stored before row checksums are read unverified; rebuild the store "
            "(`cisrank index build prior`) to verify them",
            self.path,
        )

    def _damaged(self, exc: sqlite3.Error, what: str = "SQLite cannot read it") -> Exception:
        if _is_damage(exc):
            return DamagedFileError(self.path, f"{what}: {exc}")
        return CisrankError(f"prior store '{self.path}': {what}: {exc}")

    def _checked_row(
        self, fingerprint: str, key: str, lp: float, n: int, crc: int | None
    ) -> tuple[float, int]:
        if crc is None:
            if not self._warned_unverified:
                self._warned_unverified = True
                log.warning("%s: reading priors stored without a row checksum", self.path)
        elif row_checksum(fingerprint, key, lp, n) != crc:
            raise DamagedFileError(
                self.path, f"the stored prior of passage {key[:16]} fails its row checksum"
            )
        return float(lp), int(n)

    def get_many(self, fingerprint: str, keys: Sequence[str]) -> dict[str, tuple[float, int]]:
        """Stored `(logprob, num_tokens)` for the keys present; counts hits and misses."""
        found: dict[str, tuple[float, int]] = {}
        distinct = list(dict.fromkeys(keys))
        crc_col = "checksum" if self.checked else "NULL"
        with self._lock:
            conn = self._connect()
            for start in range(0, len(distinct), _CHUNK):
                part = distinct[start : start + _CHUNK]
                marks = ",".join("?" * len(part))
                try:
                    rows = conn.execute(
                        f"SELECT passage_key, logprob, num_tokens, {crc_col} FROM priors "
                        f"WHERE fingerprint = ? AND passage_key IN ({marks})",
                        [fingerprint, *part],
                    ).fetchall()
                except sqlite3.DatabaseError as exc:
                    raise self._damaged(exc) from None
                for key, lp, n, crc in rows:
                    found[key] = self._checked_row(fingerprint, key, lp, n, crc)
            self.hits += sum(1 for k in keys if k in found)
            self.misses += sum(1 for k in keys if k not in found)
        return found

    def put_many(self, fingerprint: str, items: Iterable[tuple[str, float, int]]) -> int:
        """Store `(key, logprob, num_tokens)` entries in one transaction; returns rows written."""
        rows = [
            (fingerprint, k, float(lp), int(n), row_checksum(fingerprint, k, lp, n))
            for k, lp, n in items
        ]
        if not rows:
            return 0
        columns = "fingerprint, passage_key, logprob, num_tokens" + (
            ", checksum" if self.checked else ""
        )
        marks = ", ".join("?" * (5 if self.checked else 4))
        with self._lock:
            conn = self._connect()
            conn.execute("BEGIN IMMEDIATE")
            try:
                before = conn.total_changes
                conn.executemany(
                    f"INSERT OR IGNORE INTO priors ({columns}) VALUES ({marks})",
                    [r if self.checked else r[:4] for r in rows],
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
            try:
                if fingerprint is None:
                    return int(conn.execute("SELECT COUNT(*) FROM priors").fetchone()[0])
                return int(
                    conn.execute(
                        "SELECT COUNT(*) FROM priors WHERE fingerprint = ?", (fingerprint,)
                    ).fetchone()[0]
                )
            except sqlite3.DatabaseError as exc:
                raise self._damaged(exc) from None

    def verify(self) -> tuple[int, int, list[str]]:
        """Check the whole store: SQLite's `integrity_check`, then every row's checksum.
        Returns (rows checked, rows without a checksum, problems found)."""
        problems: list[str] = []
        checked = unverified = 0
        crc_col = "checksum" if self.checked else "NULL"
        with self._lock:
            conn = self._connect()
            try:
                report = [r[0] for r in conn.execute("PRAGMA integrity_check(20)")]
                if report != ["ok"]:
                    problems += [f"SQLite integrity_check: {line}" for line in report]
                rows = conn.execute(
                    f"SELECT fingerprint, passage_key, logprob, num_tokens, {crc_col} FROM priors"
                )
                for fp, key, lp, n, crc in rows:
                    if crc is None:
                        unverified += 1
                    elif row_checksum(fp, key, lp, n) != crc:
                        problems.append(f"the prior of passage {str(key)[:16]} fails its checksum")
                    else:
                        checked += 1
            except sqlite3.DatabaseError as exc:
                problems.append(f"SQLite cannot read it: {exc}")
        return checked, unverified, problems

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
