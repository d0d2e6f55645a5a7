"""Teacher rows on disk: Parquet shards, a state file, and a manifest last.

One shard holds a fixed set of pairs (a run of whole queries, or every pair of a run of passages:
`generate.shard_plan`), fixed by the source alone, so a resumed `generate` only has to check
which shard files exist; each is written to a temp file and renamed, so a file that
exists is complete. `manifest.json` appears only when every shard is there: `train` refuses a
folder without it.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cisrank.data.datasets import guarded_json
from cisrank.errors import DataError
from cisrank.fileio import atomic_write_text

MANIFEST = "manifest.json"
STATE = ".generate-state.json"
SHARD_GLOB = "shard-*.parquet"

SCHEMA = pa.schema(
    [
        ("qid", pa.string()),
        ("docid", pa.string()),
        ("query", pa.string()),
        ("passage", pa.string()),
        ("rank", pa.int32()),
        ("score", pa.float64()),
        ("log_conditional", pa.float64()),
        ("log_prior", pa.float64()),
    ]
)


def shard_path(out: Path, index: int) -> Path:
    return out / f"shard-{index:05d}.parquet"


def shard_bytes(columns: dict[str, list[Any]]) -> bytes:
    """A shard's rows as the bytes of its Parquet file (columns of `SCHEMA`)."""
    table = pa.table(columns, schema=SCHEMA)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def shard_rows(path: Path) -> int | None:
    """Row count of a readable shard, None for a damaged one (rewritten on resume)."""
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (OSError, pa.ArrowInvalid):
        return None


def write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        return guarded_json(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, DataError) as exc:
        why = str(exc).removeprefix(f"{path}: ")
        raise DataError(
            f"{path} is unreadable ({why}); delete the folder or pass --overwrite"
        ) from None


def read_manifest(folder: str | Path) -> dict[str, Any]:
    folder = Path(folder)
    manifest = read_json(folder / MANIFEST)
    if manifest is None:
        hint = (
            "its generate run did not finish: run the same generate command again to resume"
            if (folder / STATE).is_file()
            else "it is not a distill generate output"
        )
        raise DataError(f"'{folder}' has no {MANIFEST}: {hint}")
    return manifest


def read_rows_unchecked(folder: Path) -> pa.Table:
    """Every shard's rows in shard order, manifest or not (the generator's own final check)."""
    files = sorted(folder.glob(SHARD_GLOB))
    if not files:
        return SCHEMA.empty_table()
    return pa.concat_tables([pq.read_table(f, schema=SCHEMA) for f in files])


def read_rows(folder: str | Path) -> pa.Table:
    """All rows of a finished generate output, in shard order (by query or by passage: readers
    group by `qid` and order by `rank`)."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    n_files = len(list(folder.glob(SHARD_GLOB)))
    if n_files != manifest["shards"]:
        raise DataError(f"'{folder}': {n_files} shard files, manifest says {manifest['shards']}")
    table = read_rows_unchecked(folder)
    if table.num_rows != manifest["pairs"]:
        raise DataError(f"'{folder}': {table.num_rows} rows, manifest says {manifest['pairs']}")
    return table
