"""What the offline shard jobs write, summarized for comparison with the committed reference.

`tests/shard_outputs.json` holds the outputs of the dense build, the prior job and teacher
scoring on the exact models of `cisrank.testing` (integer-valued embeddings and log-probabilities,
scores read from a file), built at 588e04d, before the jobs shared one shard runner. `build(root)`
builds the same outputs with the code at hand (on a Ray cluster already started), and `summarize`
reduces a folder to what must not change:

- `.npy` and `.index` files: their sha256 (the bytes) and, for arrays, the values;
- Parquet files: the schema and every row (a byte comparison would also compare the writing
  pyarrow's version string);
- SQLite files: every row of every table (the page layout, and the `-wal` / `-shm` files that
  reading a WAL-mode store leaves beside it, are SQLite's business);
- manifests: every field but times, library versions, file checksums (the files are compared
  themselves) and paths under the build's root, which read `<root>`.

A prior store's fingerprint names the tokenizer's serialization, which the `tokenizers` version
may change: it reads `<store_fingerprint>` (and the engine's `<fingerprint>`), after checking that
every row carries the manifest's, and each prior row's CRC32 (which covers the fingerprint) reads
whether it checks out.

Regenerate (only for a change that is meant to change the outputs): build the outputs with
`build(root)` and write `{case: summarize(root / case, root)}` as JSON.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

REFERENCE = Path(__file__).with_name("shard_outputs.json")
CASES = (
    "dense-local",
    "dense-ray",
    "prior-local",
    "prior-ray",
    "teacher-local",
    "teacher-workers",
    "teacher-ray",
)
_SQLITE_SIDECARS = (".sqlite-wal", ".sqlite-shm")
"""Files SQLite keeps beside a WAL-mode store while or after it is read (a read-only reader
leaves them behind): its business, like the page layout, so they are not compared."""
_VOLATILE = {
    "started_at",
    "finished_at",
    "seconds",
    "seconds_this_run",
    "created",
    "libraries",
    "checksums",
    "digest",
}


def write_sources(src: Path) -> dict[str, Path]:
    """The corpus, the bi-encoder folder, the triples and the teacher's run file of the builds."""
    from cisrank import testing
    from cisrank.distill.sources import from_triples

    s = testing.SAMPLE_SENTENCES
    rows = [{"id": f"p{i}", "text": t} for i, t in enumerate(s)]
    rows += [{"id": f"c{i}", "text": f"{s[i]} {s[(3 * i + 1) % len(s)]}"} for i in range(9)]
    rows.append({"id": "dup", "text": s[0]})
    src.mkdir(parents=True)
    corpus = src / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    encoder = src / "encoder"
    encoder.mkdir()
    (encoder / "modules.json").write_text("[]\n")
    (encoder / "config.json").write_text("{}\n")
    triples = src / "triples.tsv"
    lines = []
    for i in range(7):
        query = f"question {i} about {s[i].split()[0].lower()}"
        lines.append(f"{query}\t{s[i]}\t{s[(i + 3) % len(s)]}")
        lines.append(f"{query}\t{s[i]}\t{s[(i + 5) % len(s)]}")
    triples.write_text("\n".join(lines) + "\n")
    run = src / "teacher.trec"
    queries = from_triples(triples).queries
    run.write_text(
        "".join(
            f"{q.qid} Q0 {d} {r} {(7 * qi + 3 * r) % 11 - 5.5} t\n"
            for qi, q in enumerate(queries)
            for r, d in enumerate(q.docids, 1)
        )
    )
    return {"corpus": corpus, "encoder": encoder, "triples": triples, "run": run}


def build(root: Path, engines: tuple[str, ...] = ("local", "ray")) -> None:
    """Every case of `CASES` on `engines` into `root/<case>`, the sources into `root/src`."""
    from cisrank import testing
    from cisrank.distill.generate import generate
    from cisrank.distill.sources import from_triples
    from cisrank.distill.teachers import TeacherSpec
    from cisrank.indexes.build import build_index
    from cisrank.jobs.pool import WorkerOptions
    from cisrank.jobs.ray import RayOptions

    src = write_sources(root / "src")
    two = RayOptions(actors=2, num_cpus=1)
    dense = {"model": str(src["encoder"]), "shard_size": 6, "index_type": "flat"}
    prior = {"model": "exact-lm"}
    wrap = {"batch_size": 4, "job_wrapper": testing.ExactPriorJob}
    spec = TeacherSpec.of("scores", scores_file=src["run"])
    source = from_triples(src["triples"])
    if "local" in engines:
        build_index("dense", src["corpus"], root / "dense-local", dense, progress=False,
                    options={"engine": "local", "job_wrapper": testing.ExactEncoderJob})  # fmt: skip
        build_index("prior", src["corpus"], root / "prior-local", prior, progress=False,
                    options=wrap)  # fmt: skip
        for case, options in (
            ("teacher-local", {}),
            ("teacher-workers", {"workers": WorkerOptions(workers=2)}),
        ):
            generate(source, spec, root / case, shard_pairs=5, progress=False, **options)
    if "ray" in engines:
        build_index("dense", src["corpus"], root / "dense-ray", dense, progress=False,
                    options={"engine": "ray", "ray": two,
                             "job_wrapper": testing.ExactEncoderJob})  # fmt: skip
        build_index("prior", src["corpus"], root / "prior-ray", prior, progress=False,
                    options={**wrap, "engine": "ray", "ray": two, "shard_size": 4})  # fmt: skip
        generate(source, spec, root / "teacher-ray", shard_pairs=5, progress=False,
                 engine="ray", ray=two)  # fmt: skip


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _stable(value: Any, root: str) -> Any:
    if isinstance(value, dict):
        return {k: _stable(v, root) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_stable(v, root) for v in value]
    if isinstance(value, str):
        return value.replace(root, "<root>")
    return value


def _crc(fingerprint: str, key: str, logprob: float, num_tokens: int, checksum: int) -> str:
    from cisrank.rerank.prior_store import row_checksum

    return "crc ok" if row_checksum(fingerprint, key, logprob, num_tokens) == checksum else "bad"


def _sqlite_rows(path: Path) -> dict[str, list[list[Any]]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        out = {
            t: sorted([list(r) for r in con.execute(f'SELECT * FROM "{t}"')], key=repr)
            for t in sorted(tables)
        }
    finally:
        con.close()
    for row in out.get("priors", []):  # fingerprint, passage_key, logprob, num_tokens, checksum
        row[4] = _crc(*row)
    return out


def _parquet(path: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    rows = table.to_pylist()
    for row in rows:
        if "checksum" in row:  # a prior table's row
            row["checksum"] = _crc(*(row[k] for k in table.column_names))
    return {"schema": table.schema.to_string(show_schema_metadata=False), "rows": rows}


def summarize(folder: Path, root: Path) -> dict[str, Any]:
    """What must not change in one job's output folder (see the module docstring)."""
    import numpy as np

    files: dict[str, Any] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if path.name.endswith(_SQLITE_SIDECARS):
            continue
        name = path.relative_to(folder).as_posix()
        if path.suffix == ".npy":
            array = np.load(path)
            files[name] = {"sha256": _sha256(path), "dtype": str(array.dtype),
                           "values": array.tolist()}  # fmt: skip
        elif path.suffix == ".index":
            files[name] = {"sha256": _sha256(path)}
        elif path.suffix == ".parquet":
            files[name] = _parquet(path)
        elif path.suffix == ".sqlite":
            files[name] = _sqlite_rows(path)
        elif path.suffix == ".json":
            files[name] = _stable(json.loads(path.read_text()), str(root))
        else:
            files[name] = {"sha256": _sha256(path)}
    text = json.dumps(files, sort_keys=True)
    model = files.get("manifest.json", {}).get("model", {})
    for key in ("store_fingerprint", "fingerprint"):
        if key in model and folder.name.startswith("prior"):
            text = text.replace(model[key], f"<{key}>")
    return json.loads(text)
