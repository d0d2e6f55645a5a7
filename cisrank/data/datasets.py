"""Evaluation datasets: queries, graded judgments and first-stage candidates with passage text.

The local folder layout is the one of `../shared/data/<name>/`: `topics.tsv` (qid TAB query),
`qrels.txt` (qid Q0 docid grade), `candidates-bm25-top100.json[.gz]` (a JSON array of
`{"query", "hits": [{"qid", "docid", "rank", "score", "content"}]}`). When no local folder exists,
queries and judgments come from ir_datasets (needs network the first time).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import logging
import re
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cisrank import env
from cisrank.data.types import Dataset, Hit
from cisrank.errors import DataError, json_error, require

log = logging.getLogger(__name__)

TOPICS_FILE = "topics.tsv"
QRELS_FILE = "qrels.txt"
CANDIDATE_FILES = ("candidates-bm25-top100.json", "candidates-bm25-top100.json.gz")

# Named datasets: local folder name under CISRANK_DATA_DIR, and the ir_datasets id as fallback.
KNOWN_DATASETS: dict[str, str] = {
    "trec-dl19": "msmarco-passage/trec-dl-2019/judged",
    "trec-dl20": "msmarco-passage/trec-dl-2020/judged",
    "trec-dl21": "msmarco-passage-v2/trec-dl-2021/judged",
    "trec-dl22": "msmarco-passage-v2/trec-dl-2022/judged",
}


def open_text(path: Path, newline: str | None = None):
    """Open a text file, gunzipping `.gz` transparently."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline=newline)
    return path.open("r", encoding="utf-8", newline=newline)


GZIP_MAGIC = b"\x1f\x8b"

UNREADABLE = (UnicodeDecodeError, OSError, EOFError, zlib.error)
"""What reading a text file can raise for its bytes: not UTF-8, not gzip (`gzip.BadGzipFile`
is an OSError), a gzip stream cut short (EOFError) or damaged inside (zlib.error)."""


def unreadable(path: Path, what: str, exc: BaseException) -> DataError:
    """The one-line error for a file whose bytes are not the text it should hold."""
    if isinstance(exc, UnicodeDecodeError):
        try:
            with path.open("rb") as f:
                gzipped = f.read(2) == GZIP_MAGIC
        except OSError:
            gzipped = False
        hint = (
            "it is gzip-compressed: name it .gz or gunzip it"
            if gzipped
            else "give a UTF-8 text file (is it binary, or in another encoding?)"
        )
        at = _first_bad_byte(path)
        where, why = (f"{path}:{at[0]}", at[1]) if at else (str(path), exc.reason)
        return DataError(f"{where}: not a UTF-8 {what} file ({why}): {hint}")
    if isinstance(exc, FileNotFoundError):
        return DataError(f"{what} file '{path}' does not exist")
    if isinstance(exc, (EOFError, zlib.error, gzip.BadGzipFile)):
        detail = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
        return DataError(
            f"{path}: not a readable gzip file ({detail}): restore it, or name a plain "
            "text file without .gz"
        )
    reason = getattr(exc, "strerror", None) or str(exc)
    return DataError(f"{path}: cannot read the {what} file ({reason})")


def _first_bad_byte(path: Path) -> tuple[int, str] | None:
    """(line, `byte 0x.. at column N`) of the first byte of a text file (`.gz` gunzipped) that
    is not UTF-8, found again once the text reader failed (it decodes a buffer of many lines
    at a time, so its error says where in the buffer, not on which line); None if it cannot
    be read again."""
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as fh:
            lineno = 0
            while raw := fh.readline(MAX_JSON_LINE_BYTES + 1):
                lineno += 1
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    column = len(raw[: exc.start].decode("utf-8", "replace")) + 1
                    return lineno, f"byte 0x{raw[exc.start]:02x} at column {column}"
    except (OSError, EOFError, zlib.error):
        return None
    return None


def text_lines(path: Path, what: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of a text file (`.gz` gunzipped), any unreadable byte a one-line
    DataError naming the file instead of a traceback, and a line over `MAX_JSON_LINE_BYTES`
    characters (the API's body size; a line of topics, qrels or a run is a few dozen) one
    naming its line, never read whole."""
    limit = MAX_JSON_LINE_BYTES
    try:
        with open_text(path) as f:
            lineno = 0
            while line := f.readline(limit + 1):
                lineno += 1
                if len(line) > limit:
                    raise DataError(
                        f"{path}:{lineno}: a line over {limit:,} characters, the limit of a "
                        f"line of a {what} file"
                    )
                yield lineno, line
    except UNREADABLE as exc:
        raise unreadable(path, what, exc) from None


def read_topics(path: Path) -> dict[str, str]:
    """Queries by qid; one qid given two different texts is refused naming both lines."""
    topics: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for lineno, line in text_lines(path, "topics"):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        qid, sep, text = line.partition("\t")
        qid, text = qid.strip(), text.strip()
        if not sep or not qid or not text:
            raise DataError(f"{path}:{lineno}: expected 'qid<TAB>query', got {line[:80]!r}")
        if topics.get(qid, text) != text:
            raise DataError(
                f"{path}:{lineno}: query {qid} is {text[:60]!r} here and {topics[qid][:60]!r} "
                f"on line {first_line[qid]}: keep one text per qid"
            )
        topics[qid] = text
        first_line.setdefault(qid, lineno)
    if not topics:
        raise DataError(f"{path}: no topics in file")
    return topics


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """Graded judgments. A passage judged twice with two grades is refused naming both lines
    (which one is true cannot be told, and "the last wins" changed the figures silently); the
    same line repeated is harmless and read once."""
    qrels: dict[str, dict[str, int]] = {}
    first_line: dict[tuple[str, str], int] = {}
    for lineno, line in text_lines(path, "qrels"):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 4:
            raise DataError(f"{path}:{lineno}: expected 'qid Q0 docid grade', got {line[:80]!r}")
        qid, _, docid, grade_text = parts
        try:
            grade = int(grade_text)
        except ValueError:
            raise DataError(f"{path}:{lineno}: grade {grade_text!r} is not an integer") from None
        judged = qrels.setdefault(qid, {})
        if docid in judged and judged[docid] != grade:
            raise DataError(
                f"{path}:{lineno}: query {qid} passage {docid} graded {grade} here and "
                f"{judged[docid]} on line {first_line[qid, docid]}: keep one judgment per passage"
            )
        judged[docid] = grade
        first_line.setdefault((qid, docid), lineno)
    if not qrels:
        raise DataError(f"{path}: no judgments in file")
    return qrels


MAX_JSON_DEPTH = 64
"""Levels of nested arrays/objects a JSON value the CLI reads may have (the API's limit)."""

MAX_JSON_LINE_BYTES = 16 * 1024 * 1024
"""Bytes of one line of a JSON-lines file (the API's `max_body_bytes`): a 50 MB question line was
read, ranked and written out (26 s, 1.74 GB)."""


def guarded_json(text: str, where: str) -> Any:
    """The JSON value of `text` (from `where`, `file:line`), read as the API reads a body: a
    nesting deeper than `MAX_JSON_DEPTH`, an integer of more digits than Python converts, or
    broken JSON is one `DataError` naming `where` (they were a RecursionError and a ValueError
    traceback)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise DataError(_too_deep(where)) from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: {json_error(exc)}") from None
    except ValueError:  # "Exceeds the limit (4300 digits) for integer string conversion"
        raise DataError(
            f"{where}: a JSON integer is too long: at most {sys.get_int_max_str_digits()} "
            "digits are read; write a long identifier as a string"
        ) from None
    check_depth(value, where)
    return value


def check_depth(value: Any, where: str) -> None:
    """Refuse a value (parsed JSON, or YAML) nested deeper than `MAX_JSON_DEPTH`, naming
    `where`; walked without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > MAX_JSON_DEPTH:
                    raise DataError(_too_deep(where))
                stack.append((child, depth + 1))


def _too_deep(where: str) -> str:
    return f"{where}: JSON nested too deep: at most {MAX_JSON_DEPTH} levels of arrays and objects"


@dataclass(frozen=True)
class LineFault:
    """A line `bounded_lines` does not give as text: over the size cap (`line_too_long`, never
    read whole) or not UTF-8 (`not_utf8`); `message` names its line (and column)."""

    reason: str
    message: str


_LONE_CR = re.compile(r"(?<=\r)(?!\n)")
_DRAIN = 1 << 20


def bounded_lines(
    path: Path, what: str, *, limit: int | None = None, universal: bool = False
) -> Iterator[tuple[int, str | LineFault]]:
    """(line number, line with its ending) of a text file, plain or gzip (by its first bytes),
    never holding more than `limit` bytes of one line: a longer line is read on in 1 MiB
    slices and given as a `LineFault`, as is a line that is not UTF-8 (named by its line and
    column, not a byte offset of the file), so that a caller may refuse or skip it. Lines end
    at `\n`; `universal` also ends them at a lone `\r`, as a text file opened with
    `newline=""` does (the corpus reader's numbering). A gzip stream that is cut or damaged
    is one `DataError` naming the file. `limit` None: `MAX_JSON_LINE_BYTES`."""
    limit = MAX_JSON_LINE_BYTES if limit is None else limit
    with path.open("rb") as probe:
        gzipped = probe.read(2) == GZIP_MAGIC
    lineno = 0
    try:
        with gzip.open(path, "rb") if gzipped else path.open("rb") as fh:
            while raw := fh.readline(limit + 1):
                if len(raw) > limit:
                    lineno += 1
                    while not raw.endswith(b"\n") and (raw := fh.readline(_DRAIN)):
                        pass
                    yield (
                        lineno,
                        LineFault(
                            "line_too_long",
                            f"{path}:{lineno}: a line over {limit:,} bytes, the limit of a line of "
                            f"a {what} file",
                        ),
                    )
                    continue
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    lineno += 1
                    column = len(raw[: exc.start].decode("utf-8", "replace")) + 1
                    yield (
                        lineno,
                        LineFault(
                            "not_utf8",
                            f"{path}:{lineno}: not UTF-8 (byte 0x{raw[exc.start]:02x} at column "
                            f"{column}): give the {what} file as UTF-8",
                        ),
                    )
                    continue
                for piece in _LONE_CR.split(line) if universal and "\r" in line else (line,):
                    if piece:
                        lineno += 1
                        yield lineno, piece
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise unreadable(path, what, exc) from None


def json_lines(path: Path, what: str) -> Iterator[tuple[int, Any]]:
    """(line number, value) of every non-blank line of a JSON-lines file, plain or gzip (by its
    first bytes), each read with `guarded_json`: a line over `MAX_JSON_LINE_BYTES` (never read
    whole), one that is not UTF-8 (named by its line and column, not a byte offset of the
    file) or not JSON is one `DataError` naming `file:line`."""
    for lineno, line in bounded_lines(path, what):
        if isinstance(line, LineFault):
            raise DataError(line.message)
        if line.strip():
            yield lineno, guarded_json(line, f"{path}:{lineno}")


def load_candidates_json(path: Path) -> list:
    """The raw JSON array of a candidates file (`.json` or `.json.gz`), with a clear error
    (read by `guarded_json`: a nesting or an integer it cannot take is one line too)."""
    try:
        with open_text(path) as f:
            text = f.read()
    except UNREADABLE as exc:
        raise DataError(f"{path}: not a readable candidates JSON file ({exc})") from None
    data = guarded_json(text, f"{path}: not a readable candidates JSON file")
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON array of {{query, hits}} objects")
    return data


class _Malformed(ValueError):
    """A candidates entry that does not have the documented shape."""


def _parse_hit(h: object) -> Hit:
    """One hit of a candidates entry; a missing field or a value of the wrong kind is a
    `_Malformed` (data), while an error from our own code below keeps its traceback."""
    if not isinstance(h, dict):
        raise _Malformed(f"hit {h!r:.60} is not an object")
    try:
        docid, content, score, rank = h["docid"], h["content"], h["score"], h["rank"]
    except KeyError as exc:
        raise _Malformed(f"hit without field {exc}") from None
    if not isinstance(content, str):
        raise _Malformed(f"hit {docid!r}: content is not a string")
    try:
        score, rank = float(score), int(rank)
    except (TypeError, ValueError):
        raise _Malformed(
            f"hit {docid!r}: score {score!r} or rank {rank!r} is not a number"
        ) from None
    return Hit(str(docid), content, score, rank)


def read_candidates(path: Path) -> tuple[dict[str, str], dict[str, list[Hit]], int]:
    """Parse a candidates JSON; returns (queries, hits per qid, duplicate hits dropped)."""
    data = load_candidates_json(path)
    queries: dict[str, str] = {}
    candidates: dict[str, list[Hit]] = {}
    dropped = 0
    for i, entry in enumerate(data):
        try:
            if not isinstance(entry, dict) or "hits" not in entry:
                raise _Malformed("expected an object with a 'hits' array")
            raw_hits = entry["hits"]
            if not raw_hits:
                continue
            if not isinstance(raw_hits, list):
                raise _Malformed("'hits' is not an array")
            first = raw_hits[0]
            if not isinstance(first, dict) or "qid" not in first:
                raise _Malformed("its first hit has no 'qid'")
            qid = str(first["qid"])
            hits = sorted((_parse_hit(h) for h in raw_hits), key=lambda h: h.rank)
        except _Malformed as exc:
            raise DataError(f"{path}: entry {i} is malformed ({exc})") from None
        seen: set[str] = set()
        unique = []
        for h in hits:
            if h.docid in seen:
                dropped += 1
                continue
            seen.add(h.docid)
            unique.append(h)
        queries[qid] = entry.get("query", "")
        candidates[qid] = unique
    return queries, candidates, dropped


def load_local(
    name: str,
    *,
    topics: Path | None = None,
    qrels: Path | None = None,
    candidates: Path | None = None,
    require_qrels: bool = True,
) -> Dataset:
    """Load from explicit files; missing topics fall back to the query text in the candidates."""
    if candidates is None:
        raise DataError("a candidates file is needed (the first-stage run with passage text)")
    for label, p in (("topics", topics), ("qrels", qrels), ("candidates", candidates)):
        if p is not None and not Path(p).is_file():
            raise DataError(f"{label} file '{p}' does not exist")
    cand_queries, cands, dropped = read_candidates(Path(candidates))
    notes = []
    if dropped:
        notes.append(f"{dropped} duplicate docids in the candidates were collapsed (first kept)")
        log.warning("%s: %s", candidates, notes[-1])
    topic_map = (
        read_topics(Path(topics)) if topics else {q: t for q, t in cand_queries.items() if t}
    )
    if qrels is None and require_qrels:
        raise DataError(f"dataset '{name}': no qrels file, so nothing to evaluate against")
    qrel_map = read_qrels(Path(qrels)) if qrels else {}
    return Dataset(
        name, topic_map, qrel_map, cands, source=str(Path(candidates).parent), notes=notes
    )


def load_folder(folder: str | Path, name: str | None = None, require_qrels: bool = True) -> Dataset:
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise DataError(f"data folder '{folder}' does not exist")
    cand = next((folder / c for c in CANDIDATE_FILES if (folder / c).is_file()), None)
    if cand is None:
        raise DataError(f"data folder '{folder}' has no {' or '.join(CANDIDATE_FILES)}")
    topics = folder / TOPICS_FILE
    qrels = folder / QRELS_FILE
    return load_local(
        name or folder.name,
        topics=topics if topics.is_file() else None,
        qrels=qrels if qrels.is_file() else None,
        candidates=cand,
        require_qrels=require_qrels,
    )


def load_named(
    name: str, data_dir: str | Path | None = None, require_qrels: bool = True
) -> Dataset:
    """A dataset by name: `--data-dir`, else `$CISRANK_DATA_DIR/<name>`, else ir_datasets.

    `require_qrels=False` admits unjudged query sets (DL22 here), which distillation scores with
    a teacher instead of evaluating."""
    if data_dir is not None:
        return load_folder(data_dir, name, require_qrels)
    root = env.data_dir()
    if root is not None and (root / name).is_dir():
        return load_folder(root / name, name, require_qrels)
    if name not in KNOWN_DATASETS:
        raise DataError(
            f"unknown dataset '{name}' and no folder for it: pass --data-dir DIR "
            f"(known names: {', '.join(KNOWN_DATASETS)})"
        )
    where = f"{root / name} does not exist" if root else f"{env.DATA_DIR} is not set"
    if importlib.util.find_spec("ir_datasets") is None:
        raise DataError(
            f"no local folder for {name} ({where}): set {env.DATA_DIR} to the folder that holds "
            f"{name}/, or pass --data-dir DIR; without a local copy, `pip install "
            "'cisrank[ir-datasets]'` lets cisrank download it"
        )
    log.info("no local folder for %s (%s); trying ir_datasets", name, where)
    return load_ir_datasets(name, KNOWN_DATASETS[name], local_hint=where)


# What a failed download (requests' errors are OSErrors), an unknown dataset id (KeyError) or a
# corrupt cached file raises; anything else is a bug here or in ir_datasets and keeps its traceback.
_IR_DATASETS_DATA_ERRORS = (OSError, EOFError, KeyError, ValueError)


def load_ir_datasets(name: str, dataset_id: str, depth: int = 100, local_hint: str = "") -> Dataset:
    """Queries, qrels and the official first-stage run (with passage text) from ir_datasets."""
    ir_datasets = require("ir_datasets", "ir-datasets", "loading datasets without a local folder")
    try:
        ds = ir_datasets.load(dataset_id)
        topics = {q.query_id: q.text for q in ds.queries_iter()}
        qrels: dict[str, dict[str, int]] = {}
        for r in ds.qrels_iter():
            qrels.setdefault(r.query_id, {})[r.doc_id] = int(r.relevance)
        ranked: dict[str, list[tuple[str, float]]] = {}
        for sd in ds.scoreddocs_iter():
            if sd.query_id in topics:
                ranked.setdefault(sd.query_id, []).append((sd.doc_id, float(sd.score)))
        store = ds.docs_store()
        candidates: dict[str, list[Hit]] = {}
        for qid, pairs in ranked.items():
            pairs = sorted(pairs, key=lambda p: -p[1])[:depth]
            docs = store.get_many([d for d, _ in pairs])
            candidates[qid] = [
                Hit(d, docs[d].text, s, r) for r, (d, s) in enumerate(pairs, 1) if d in docs
            ]
    except _IR_DATASETS_DATA_ERRORS as exc:
        raise DataError(
            f"ir_datasets could not load '{dataset_id}' ({type(exc).__name__}: {exc}); "
            f"it downloads on first use, and {local_hint or 'no local folder was given'}: "
            f"pass --data-dir with a local copy ({TOPICS_FILE}, {QRELS_FILE}, {CANDIDATE_FILES[0]})"
        ) from None
    return Dataset(name, topics, qrels, candidates, source=f"ir_datasets:{dataset_id}")
