"""Teacher sets: the teachers' scores as a compact table the repository can carry, joined back
to query and passage text from the data they were computed on when a student trains.

Why: scoring a training pool with a causal LM costs CPU-hours; training a student costs minutes
to an hour. Committing the scores (ids and floats, never MS MARCO text, which stays in
`../shared/data`) lets anyone retrain a student, choose another fusion of the teachers, or
another loss, without rescoring. One row per (query, passage) pair:

    qid, docid, rank (first-stage), and one float32 column per teacher component
    (`cis`, `dense`, ...), with the table's provenance (each component's model, backend, compute
    type, template, estimator, fingerprint, the generate run's source, the commit) in the
    Parquet metadata under `cisrank`.

`pack` joins `distill generate` outputs of several components over the same pairs; `load`
reads a set back; `attach_text` finds every query and passage text by id in the sources the
set names (the training pool folder of `distill pool`, or a named dataset).
"""

from __future__ import annotations

import io
import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from cisrank.data.datasets import guarded_json, json_lines
from cisrank.distill import rows as R
from cisrank.errors import DataError
from cisrank.fileio import atomic_write_bytes

METADATA_KEY = b"cisrank"
KEY_COLUMNS = ("qid", "docid", "rank")
QUERY_COLUMN = "query"
"""The query text of each pair, kept only for queries the project wrote itself (`distill synth`):
they are in no data folder to join back from."""


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except OSError:
        return None
    return out.stdout.strip() or None


@dataclass
class TeacherSet:
    """Pairs with their components' scores; `texts` names where the text of each id lives."""

    qid: list[str]
    docid: list[str]
    rank: list[int]
    scores: dict[str, np.ndarray]
    provenance: dict[str, Any]
    queries: dict[str, str] | None = None
    """Query text by qid, where the set carries it (`pack(..., with_queries=True)`)."""

    @property
    def components(self) -> list[str]:
        return list(self.scores)

    def __len__(self) -> int:
        return len(self.qid)

    def by_query(self) -> dict[str, list[int]]:
        """Row indices of each query, ordered by first-stage rank."""
        out: dict[str, list[int]] = {}
        for i, q in enumerate(self.qid):
            out.setdefault(q, []).append(i)
        return {q: sorted(ix, key=lambda i: self.rank[i]) for q, ix in out.items()}

    def sample(self, queries: int, seed: int) -> TeacherSet:
        """The rows of `queries` of its queries, drawn by `seed`: the first of a seeded shuffle of
        the sorted qids, so that a larger sample of the same seed holds a smaller one (the points
        of a learning curve are nested, each adding queries to the last). All of them when it
        has no more."""
        if queries < 1:
            raise DataError(f"a teacher set sample needs at least one query, got {queries}")
        qids = sorted(set(self.qid))
        if queries >= len(qids):
            return self
        order = np.random.default_rng(seed).permutation(len(qids))
        kept = {qids[i] for i in order[:queries]}
        rows = [i for i, q in enumerate(self.qid) if q in kept]
        return replace(
            self,
            qid=[self.qid[i] for i in rows],
            docid=[self.docid[i] for i in rows],
            rank=[self.rank[i] for i in rows],
            scores={name: col[rows] for name, col in self.scores.items()},
            queries=None
            if self.queries is None
            else {q: t for q, t in self.queries.items() if q in kept},
        )


def parse_set_spec(spec: str | Path) -> tuple[Path, int | None]:
    """`PATH` or `PATH@N` (N of its queries, `TeacherSet.sample`): the path and N. A file whose
    name itself ends in `@` and digits is read whole."""
    text = str(spec)
    path, sep, count = text.rpartition("@")
    if not sep or not count.isdigit() or Path(text).exists():
        return Path(text), None
    return Path(path), int(count)


def pack(
    components: Mapping[str, str | Path],
    out: str | Path,
    texts: Mapping[str, Any],
    note: str = "",
    with_queries: bool = False,
) -> TeacherSet:
    """Join `distill generate` outputs (component name -> folder) over their (qid, docid)
    pairs into one compact Parquet file at `out`. Every folder must hold exactly the same
    pairs; `texts` says where their text lives (e.g. `{"pool": "out/trainset"}` or
    `{"dataset": "trec-dl22"}`), recorded for `attach_text`. `with_queries`: the set carries
    each pair's query text too (for queries `distill synth` wrote, which no data folder holds;
    passages are still joined back by id)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not components:
        raise DataError("give at least one component: NAME=FOLDER of a distill generate run")
    first_keys: list[tuple[str, str]] | None = None
    ranks: list[int] = []
    query_text: list[str] = []
    scores: dict[str, np.ndarray] = {}
    provenance: dict[str, Any] = {"components": {}, "texts": dict(texts), "note": note}
    for name, folder in components.items():
        table = R.read_rows(folder).select(["qid", "docid", "rank", "score", "query"]).to_pydict()
        keys = list(zip(table["qid"], table["docid"], strict=True))
        order = sorted(range(len(keys)), key=lambda i: keys[i])
        keys = [keys[i] for i in order]
        if len(set(keys)) != len(keys):
            raise DataError(f"'{folder}' scores a (qid, docid) pair twice")
        if first_keys is None:
            first_keys = keys
            ranks = [int(table["rank"][i]) for i in order]
            query_text = [str(table["query"][i]) for i in order]
        elif keys != first_keys:
            raise DataError(f"'{folder}' does not score the same pairs as the first component")
        values = np.asarray([table["score"][i] for i in order], dtype=np.float64)
        if not np.all(np.isfinite(values)):
            raise DataError(f"'{folder}' holds a non-finite teacher score")
        scores[name] = values.astype(np.float32)
        manifest = R.read_manifest(folder)
        provenance["components"][name] = {
            "teacher": manifest["identity"]["teacher"],
            "source": manifest["identity"]["source"],
            "pairs_sha256": manifest["identity"]["pairs_sha256"],
            "cisrank_version": manifest.get("cisrank_version"),
        }
    assert first_keys is not None
    provenance["commit"] = _commit()
    provenance["pairs"] = len(first_keys)
    provenance["queries"] = len({q for q, _ in first_keys})
    columns = {
        "qid": pa.array([q for q, _ in first_keys], pa.string()),
        "docid": pa.array([d for _, d in first_keys], pa.string()),
        "rank": pa.array(ranks, pa.int32()),
        **({QUERY_COLUMN: pa.array(query_text, pa.string())} if with_queries else {}),
        **{name: pa.array(v, pa.float32()) for name, v in scores.items()},
    }
    table = pa.table(columns).replace_schema_metadata(
        {METADATA_KEY: json.dumps(provenance, sort_keys=True).encode()}
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", compression_level=19)
    atomic_write_bytes(Path(out), buf.getvalue())
    return load(out)


REPACK = "pack it again with `cisrank distill pack`"


def load(path: str | Path) -> TeacherSet:
    """A packed set, every part checked before anything trains on it: its provenance is a JSON
    object, its ids are strings or integers, its ranks integers, each component a column of
    finite numbers, no cell empty, no (qid, docid) pair twice and at least one pair
    (docs/reliability.md: each of these was a traceback or trained silently)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise DataError(f"teacher set '{path}' does not exist")
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise DataError(f"teacher set '{path}' is not readable Parquet ({exc})") from None
    meta = table.schema.metadata or {}
    if METADATA_KEY not in meta:
        raise DataError(f"'{path}' is not a cisrank teacher set (no provenance)")
    try:  # a teacher set is a user's file: read as the API reads a body
        provenance = guarded_json(meta[METADATA_KEY].decode("utf-8"), "")
    except (UnicodeDecodeError, DataError):
        raise DataError(
            f"teacher set '{path}': its provenance (Parquet metadata 'cisrank') is not JSON: "
            f"{REPACK}"
        ) from None
    if not isinstance(provenance, dict):
        raise DataError(
            f"teacher set '{path}': its provenance (Parquet metadata 'cisrank') is a JSON "
            f"{type(provenance).__name__}, not an object: {REPACK}"
        )
    missing = [c for c in KEY_COLUMNS if c not in table.column_names]
    if missing:
        raise DataError(f"teacher set '{path}' lacks column(s) {', '.join(missing)}")
    components = [c for c in table.column_names if c not in (*KEY_COLUMNS, QUERY_COLUMN)]
    if not components:
        raise DataError(f"teacher set '{path}' has no score column (a teacher component)")
    for name in table.column_names:
        column = table.column(name)
        kind = column.type
        if name in ("qid", "docid"):
            fits = pa.types.is_string(kind) or pa.types.is_large_string(kind)
            fits = fits or pa.types.is_integer(kind)
            want = "ids (strings or integers)"
        elif name == "rank":
            fits, want = pa.types.is_integer(kind), "integer first-stage ranks"
        elif name == QUERY_COLUMN:
            fits = pa.types.is_string(kind) or pa.types.is_large_string(kind)
            want = "query texts"
        else:
            fits = pa.types.is_integer(kind) or pa.types.is_floating(kind)
            want = "numbers (a teacher component's scores)"
        if not fits:
            raise DataError(f"teacher set '{path}': column '{name}' holds {kind}, not {want}")
        if column.null_count:
            raise DataError(
                f"teacher set '{path}': column '{name}' has {column.null_count} empty cell(s)"
            )
    if table.num_rows == 0:
        raise DataError(f"teacher set '{path}' holds no pairs: nothing to train on")
    data = table.to_pydict()
    qids = [str(q) for q in data["qid"]]
    docids = [str(d) for d in data["docid"]]
    first: dict[tuple[str, str], int] = {}
    for row, key in enumerate(zip(qids, docids, strict=True)):
        if key in first:
            raise DataError(
                f"teacher set '{path}': query {key[0]} passage {key[1]} is in rows "
                f"{first[key]} and {row}: each pair once ({REPACK})"
            )
        first[key] = row
    scores = {c: np.asarray(data[c], dtype=np.float64) for c in components}
    for name, values in scores.items():
        if not np.all(np.isfinite(values)):
            raise DataError(f"teacher set '{path}': component '{name}' holds a non-finite score")
    queries: dict[str, str] | None = None
    if QUERY_COLUMN in data:
        queries = {}
        for q, text in zip(qids, data[QUERY_COLUMN], strict=True):
            if queries.setdefault(q, text) != text:
                raise DataError(f"teacher set '{path}': query {q} has two texts ({REPACK})")
    return TeacherSet(
        qids, docids, [int(r) for r in data["rank"]], scores, provenance, queries=queries
    )


@dataclass(frozen=True)
class Texts:
    """Query and passage text by id."""

    queries: dict[str, str]
    passages: dict[str, str]


def texts_of(teacher_set: TeacherSet, pool: str | Path | None = None) -> Texts:
    """The texts a set names: its training pool (`distill pool` output, the folder given here
    or recorded) or a named dataset (read from `CISRANK_DATA_DIR`)."""
    from cisrank.data.datasets import load_named, read_topics

    where = teacher_set.provenance.get("texts", {})
    if not isinstance(where, dict):
        raise DataError(
            f"the teacher set's provenance names its texts as {where!r:.60}, not an object "
            f'such as {{"pool": FOLDER}} or {{"dataset": NAME}}: {REPACK}'
        )
    if "dataset" in where:
        ds = load_named(where["dataset"], require_qrels=False)
        passages = {h.docid: h.text for hits in ds.candidates.values() for h in hits}
        return Texts(dict(ds.topics), passages)
    folder = Path(pool or where.get("pool") or "")
    from cisrank.distill.trainset import POOL_FILE, TOPICS_FILE

    if not (folder / POOL_FILE).is_file():
        raise DataError(
            f"no training pool at '{folder}': run `cisrank distill pool --out {folder}` first "
            "(it rebuilds the pool from the data folder in a second)"
        )
    passages = {}
    for lineno, row in json_lines(folder / POOL_FILE, "training pool"):
        if not isinstance(row, dict) or not isinstance(row.get("id"), str) or "text" not in row:
            raise DataError(f'{folder / POOL_FILE}:{lineno}: expected {{"id", "text"}}')
        passages[row["id"]] = row["text"]
    return Texts(read_topics(folder / TOPICS_FILE), passages)


def attach_text(
    teacher_set: TeacherSet, texts: Texts, components: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Per query, in first-stage order: its text, passages and each component's scores (the
    shape `distill.train` builds examples from). Every id must be found."""
    out = []
    names = list(components or teacher_set.components)
    if teacher_set.queries is not None:
        texts = Texts({**texts.queries, **teacher_set.queries}, texts.passages)
    for qid, ix in teacher_set.by_query().items():
        if qid not in texts.queries:
            raise DataError(f"no text for query '{qid}' of the teacher set")
        missing = [teacher_set.docid[i] for i in ix if teacher_set.docid[i] not in texts.passages]
        if missing:
            raise DataError(f"no text for passage '{missing[0]}' ({len(missing)} missing)")
        out.append(
            {
                "qid": qid,
                "query": texts.queries[qid],
                "passages": [texts.passages[teacher_set.docid[i]] for i in ix],
                "ranks": [teacher_set.rank[i] for i in ix],
                "components": {n: [float(teacher_set.scores[n][i]) for i in ix] for n in names},
            }
        )
    return out
