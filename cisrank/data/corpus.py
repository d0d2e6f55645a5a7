"""Corpus readers: jsonl, tsv and the TREC DL candidates json (whose distinct passages form a pool).

Every index is built from the same stream of `Passage`s, so BM25, Lucene and dense indexes of one
file hold the same ids in the same order. Bad input never becomes a silently wrong index:

- `on_error="raise"` (the default): the first bad line (invalid JSON, a missing or non-string
  field, an empty id or text, a duplicate id) raises a `DataError` naming `file:line` and what
  to do.
- `on_error="skip"`: bad lines are skipped and counted per reason in `CorpusStats.skipped`; the
  counts go into the index manifest so the loss is visible. For a duplicate id, the first
  occurrence is kept.

The candidates json is a ranking, not a corpus: one passage appears under many queries, so a
repeated docid with the *same* text is merged (counted in `merged`), while the same docid with a
*different* text is an error like any duplicate.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cisrank.data.datasets import LineFault, bounded_lines, guarded_json, load_candidates_json
from cisrank.data.types import Passage
from cisrank.errors import DataError

Format = Literal["jsonl", "tsv", "candidates"]
OnError = Literal["raise", "skip"]
FORMATS: tuple[str, ...] = ("jsonl", "tsv", "candidates")


@dataclass
class CorpusStats:
    """What a read produced: counts kept, skipped (by reason) and merged, plus the file checksum."""

    path: str
    format: str
    passages: int = 0
    skipped: Counter = field(default_factory=Counter)
    merged: int = 0
    sha256: str = ""
    size_bytes: int = 0

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "format": self.format,
            "passages": self.passages,
            "skipped": dict(self.skipped),
            "merged_repeats": self.merged,
            "sha256": self.sha256,
            "size_bytes": self.size_bytes,
        }


def detect_format(path: Path) -> Format:
    """By suffix (after an optional .gz): .jsonl/.ndjson, .tsv/.txt, .json (candidates)."""
    name = path.name.lower().removesuffix(".gz")
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if name.endswith((".tsv", ".txt")):
        return "tsv"
    if name.endswith(".json"):
        return "candidates"
    raise DataError(
        f"cannot tell the corpus format of '{path}' from its name: pass --format "
        f"({', '.join(FORMATS)})"
    )


def file_checksum(path: Path, chunk: int = 1 << 20) -> tuple[str, int]:
    """sha256 and size of the file as given (compressed bytes for .gz): the manifest's identity."""
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
            size += len(block)
    return h.hexdigest(), size


class _Checker:
    """Applies the bad-line policy; remembers ids (and text hashes, for merging repeats)."""

    def __init__(self, path: Path, on_error: OnError, stats: CorpusStats, merge_same: bool):
        if on_error not in ("raise", "skip"):
            raise DataError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        self.path, self.on_error, self.stats, self.merge_same = path, on_error, stats, merge_same
        # id -> (where first seen, content digest); the digest only where repeats may merge
        self.seen: dict[str, tuple[int | str, bytes]] = {}

    def bad(self, where: int | str, reason: str, message: str) -> None:
        if self.on_error == "raise":
            raise DataError(
                f"{self.path}:{where}: {message} (fix the line, or pass --on-error skip to "
                "skip bad lines and count them in the manifest)"
            )
        self.stats.skipped[reason] += 1

    def accept(self, where: int | str, docid: str, text: str, title: str) -> Passage | None:
        if not docid.strip():
            self.bad(where, "empty_id", "empty passage id")
            return None
        if not text.strip():
            self.bad(where, "empty_text", f"passage '{docid}' has empty text")
            return None
        digest = (
            hashlib.blake2b(f"{title}\n{text}".encode(), digest_size=16).digest()
            if self.merge_same
            else b""
        )
        if docid in self.seen:
            first, first_digest = self.seen[docid]
            if self.merge_same and digest == first_digest:
                self.stats.merged += 1
                return None
            self.bad(where, "duplicate_id", f"duplicate passage id '{docid}' (first at {first})")
            return None
        self.seen[docid] = (where, digest)
        self.stats.passages += 1
        return Passage(docid, text, title)


def _lines(path: Path, check: _Checker) -> Iterator[tuple[int, str]]:
    """The corpus's lines (numbered as a text file opened with `newline=""` numbers them), a
    line over `MAX_JSON_LINE_BYTES` (never read whole: a 50 MB line was held, decoded and
    parsed whole) or not UTF-8 given to the bad-line policy as `line_too_long`/`not_utf8`."""
    for lineno, line in bounded_lines(path, "corpus", universal=True):
        if isinstance(line, LineFault):
            check.bad(lineno, line.reason, line.message.removeprefix(f"{path}:{lineno}: "))
        elif line.strip():
            yield lineno, line


def _iter_jsonl(path: Path, check: _Checker) -> Iterator[Passage]:
    for lineno, line in _lines(path, check):
        try:
            obj = guarded_json(line, "")
        except DataError as exc:  # broken, nested too deep, an integer too long
            check.bad(lineno, "invalid_json", str(exc).removeprefix(": "))
            continue
        if not isinstance(obj, dict):
            check.bad(lineno, "invalid_json", 'expected a JSON object {"id", "text"}')
            continue
        docid = obj.get("id", obj.get("_id", obj.get("docid")))
        text = obj.get("text", obj.get("contents"))
        title = obj.get("title") or ""
        if docid is None or text is None:
            check.bad(lineno, "missing_field", 'expected fields "id" and "text"')
            continue
        if isinstance(docid, int) and not isinstance(docid, bool):
            docid = str(docid)
        if not isinstance(docid, str) or not isinstance(text, str) or not isinstance(title, str):
            check.bad(lineno, "bad_field", '"id", "text" and "title" must be strings')
            continue
        if (p := check.accept(lineno, docid, text, title)) is not None:
            yield p


def _iter_tsv(path: Path, check: _Checker) -> Iterator[Passage]:
    for lineno, line in _lines(path, check):
        line = line.rstrip("\r\n")
        docid, sep, text = line.partition("\t")
        if not sep:
            check.bad(lineno, "missing_field", "expected 'id<TAB>text'")
            continue
        if (p := check.accept(lineno, docid, text, "")) is not None:
            yield p


def _iter_candidates(path: Path, check: _Checker) -> Iterator[Passage]:
    data = load_candidates_json(path)
    for i, entry in enumerate(data):
        hits = entry.get("hits") if isinstance(entry, dict) else None
        if not isinstance(hits, list):
            check.bad(f"entry {i}", "missing_field", "expected an object with a 'hits' list")
            continue
        for j, h in enumerate(hits):
            where = f"entry {i} hit {j}"
            if not isinstance(h, dict) or "docid" not in h or "content" not in h:
                check.bad(where, "missing_field", "expected a hit with 'docid' and 'content'")
                continue
            if not isinstance(h["content"], str):
                check.bad(where, "bad_field", "'content' must be a string")
                continue
            if (p := check.accept(where, str(h["docid"]), h["content"], "")) is not None:
                yield p


def iter_corpus(
    path: str | Path,
    fmt: Format | None = None,
    on_error: OnError = "raise",
    stats: CorpusStats | None = None,
) -> Iterator[Passage]:
    """Stream the passages of a corpus file in file order, applying the bad-line policy."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"corpus file '{path}' does not exist")
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise DataError(f"unknown corpus format '{fmt}': use one of {', '.join(FORMATS)}")
    stats = stats if stats is not None else CorpusStats(str(path), fmt)
    check = _Checker(path, on_error, stats, merge_same=fmt == "candidates")
    reader = {"jsonl": _iter_jsonl, "tsv": _iter_tsv, "candidates": _iter_candidates}[fmt]
    try:
        yield from reader(path, check)
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc})") from None


@dataclass
class Corpus:
    """A whole corpus in memory (ids and contents in file order) with its read statistics."""

    docids: list[str]
    texts: list[str]
    stats: CorpusStats

    def __len__(self) -> int:
        return len(self.docids)


class CorpusReader:
    """A corpus file that builders may stream (any number of passes) or load whole.

    Streaming keeps memory flat for engines that index passage by passage (Lucene); `load()`
    serves those that need everything at once (bm25s, FAISS). Each complete pass validates the
    whole file again and leaves its statistics, with the file checksum, in `stats`.
    """

    def __init__(
        self, path: str | Path, fmt: Format | None = None, on_error: OnError = "raise"
    ) -> None:
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise DataError(f"corpus file '{self.path}' does not exist")
        self.fmt: Format = fmt or detect_format(self.path)
        self.on_error: OnError = on_error
        self.stats: CorpusStats | None = None

    def __iter__(self) -> Iterator[Passage]:
        stats = CorpusStats(str(self.path), self.fmt)
        yield from iter_corpus(self.path, self.fmt, self.on_error, stats)
        if not stats.passages:
            raise DataError(
                f"corpus '{self.path}' holds no usable passages (skipped: {dict(stats.skipped)})"
            )
        stats.sha256, stats.size_bytes = file_checksum(self.path)
        self.stats = stats

    def load(self) -> Corpus:
        docids: list[str] = []
        texts: list[str] = []
        for p in self:
            docids.append(p.docid)
            texts.append(p.contents)
        assert self.stats is not None
        return Corpus(docids, texts, self.stats)


def read_corpus(path: str | Path, fmt: Format | None = None, on_error: OnError = "raise") -> Corpus:
    """Read and validate a whole corpus into memory; raises if no passage survives."""
    return CorpusReader(path, fmt, on_error).load()
