"""The conversion caches are checked like a pulled model: every file of an ONNX export (and of a
CTranslate2 conversion) has its sha256 in the folder's record, checked before every load by a `stat`
while unchanged; a damaged file makes the folder be converted again with one warning, never a silent
score or a traceback. Through `cisrank rerank`, as the probe ran it."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
from cli.helpers import main_in_process

from cisrank.lm.backends import load_engine
from cisrank.models import integrity
from cisrank.runtimes import lm_onnx as onnx_backend
from cisrank.testing import SAMPLE_SENTENCES

pytest.importorskip("onnxruntime")

QUERY = "When was the author of Hamlet born?"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """This test's own user cache: exports, stamps and locks go there."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(integrity, "_MEMORY", {})
    return tmp_path / "cache" / "cisrank" / "onnx"


@pytest.fixture
def calls(monkeypatch) -> dict[str, int]:
    """How many exports and int8 quantizations were made."""
    counted = {"export": 0, "quantize": 0}
    export, quantize = onnx_backend._export, onnx_backend._quantize

    def counting_export(source, out, reference):
        counted["export"] += 1
        return export(source, out, reference)

    def counting_quantize(folder):
        counted["quantize"] += 1
        return quantize(folder)

    monkeypatch.setattr(onnx_backend, "_export", counting_export)
    monkeypatch.setattr(onnx_backend, "_quantize", counting_quantize)
    return counted


def _rerank(monkeypatch, capsys, model: Path, passages: Path, dtype: str):
    args = ["rerank", "--reranker", "cis", "--model", str(model), "--backend", "onnx"]
    args += ["--dtype", dtype, "--query", QUERY, "--passages", str(passages), "--json"]
    return main_in_process(monkeypatch, capsys, *args, "--workers", "1")


def _scores(run) -> list[float]:
    assert run.code == 0, run.err
    return [r["score"] for r in sorted(json.loads(run.out)["results"], key=lambda r: r["index"])]


def read_record(folder: Path, name: str) -> dict:
    return json.loads((folder / name).read_text(encoding="utf-8"))


def _zero(path: Path, start: int, length: int) -> None:
    """Overwrite `length` bytes at `start` with zeros, keeping the file's size."""
    with path.open("r+b") as f:
        f.seek(start)
        f.write(b"\0" * length)


def test_zeroed_head_rows_and_a_zeroed_int8_body_are_made_again_not_scored(
    tiny_llama_dir, cache, calls, tmp_path, monkeypatch, capsys, caplog
):
    """Before: 100 zeroed rows of `head.npy` changed the scores with exit 0, and 1 MiB zeroed in
    `body-int8.onnx` was an InvalidProtobuf traceback, the export never made again."""
    passages = tmp_path / "passages.txt"
    passages.write_text("\n".join(SAMPLE_SENTENCES[:4]) + "\n")
    intact = {
        dtype: _scores(_rerank(monkeypatch, capsys, tiny_llama_dir, passages, dtype))
        for dtype in ("float32", "int8")
    }
    assert calls == {"export": 1, "quantize": 1}
    (folder,) = [p for p in cache.iterdir() if p.is_dir()]
    head = np.load(folder / "head.npy")
    rows = min(100, head.shape[0] // 2)
    header = (folder / "head.npy").stat().st_size - head.nbytes
    _zero(folder / "head.npy", header, rows * head.shape[1] * 4)
    assert not np.load(folder / "head.npy")[:rows].any()  # what the probe did
    with caplog.at_level(logging.WARNING, logger="cisrank.runtimes.checked_cache"):
        again = _scores(_rerank(monkeypatch, capsys, tiny_llama_dir, passages, "float32"))
    assert again == pytest.approx(intact["float32"], abs=1e-6)
    assert calls["export"] == 2
    record = read_record(folder, "cisrank-onnx.json")  # made again: float32 only, so far
    assert sorted(record["files"]) == ["body.onnx", "head.npy"]
    assert record["provenance_sha256"] == integrity.provenance_digest(record)
    assert [r.getMessage() for r in caplog.records] == [
        f"the ONNX export {folder} is damaged (head.npy: its sha256 differs from the one "
        "recorded): making it again"
    ]

    int8_scores = _scores(_rerank(monkeypatch, capsys, tiny_llama_dir, passages, "int8"))
    assert int8_scores == pytest.approx(intact["int8"], abs=1e-6) and calls["quantize"] == 2
    record = read_record(folder, "cisrank-onnx.json")  # the int8 body added to the record
    assert sorted(record["files"]) == ["body-int8.onnx", "body.onnx", "head.npy"]
    assert record["provenance_sha256"] == integrity.provenance_digest(record)
    body = folder / "body-int8.onnx"
    size = body.stat().st_size
    _zero(body, size // 4, min(1 << 20, size // 2))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cisrank.runtimes.checked_cache"):
        run = _rerank(monkeypatch, capsys, tiny_llama_dir, passages, "int8")
    assert _scores(run) == pytest.approx(intact["int8"], abs=1e-6), run.err
    assert "Traceback" not in run.err and calls == {"export": 2, "quantize": 3}
    assert [r.getMessage() for r in caplog.records] == [
        f"the ONNX export {folder} is damaged (body-int8.onnx: its sha256 differs from the one "
        "recorded): making body-int8.onnx again"
    ]


def test_an_unchanged_export_is_not_read_an_older_or_added_to_one_is_made_again(
    tiny_llama_dir, cache, calls, monkeypatch
):
    """The check is a `stat` per file while nothing changed; an export of an older cisrank (a
    record without checksums) is made again, and its fingerprint, which keys prior stores, is
    the one that record gave; a file added to an export is damage too."""
    first = load_engine(str(tiny_llama_dir), backend="onnx", dtype="float32")
    (folder,) = [p for p in cache.iterdir() if p.is_dir()]
    hashed: list[str] = []
    real = integrity.sha256_file
    monkeypatch.setattr(integrity, "sha256_file", lambda p: hashed.append(p.name) or real(p))
    assert load_engine(str(tiny_llama_dir), backend="onnx", dtype="float32").fingerprint() == (
        first.fingerprint()
    )
    assert hashed == [] and calls["export"] == 1
    from cisrank.runtimes.checked_cache import identity

    record = read_record(folder, "cisrank-onnx.json")
    old = {k: v for k, v in record.items() if k not in ("files", "provenance_sha256")}
    (folder / "cisrank-onnx.json").write_text(json.dumps(old, indent=2))  # as written before
    assert identity(old) == json.dumps(old, indent=2).encode()
    again = load_engine(str(tiny_llama_dir), backend="onnx", dtype="float32")
    assert calls["export"] == 2 and again.fingerprint() == first.fingerprint()
    assert "files" in read_record(folder, "cisrank-onnx.json")
    (folder / "extra.onnx").write_bytes(b"\0" * 16)  # a file the export did not write: damage
    load_engine(str(tiny_llama_dir), backend="onnx", dtype="float32")
    assert calls["export"] == 3 and not (folder / "extra.onnx").exists()
    # damaged where it cannot be made again (a read-only cache): one line, not a traceback
    import errno

    from cisrank.errors import CisrankError
    from cisrank.runtimes import checked_cache

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(checked_cache.tempfile, "mkdtemp", read_only)
    _zero(folder / "head.npy", 128, 64)
    with pytest.raises(CisrankError) as caught:
        load_engine(str(tiny_llama_dir), backend="onnx", dtype="float32")
    assert str(caught.value) == (
        f"the conversion cache {folder} must be made again (head.npy: its sha256 differs from "
        f"the one recorded) but cannot be written (Read-only file system): make {cache} "
        "writable, or set XDG_CACHE_HOME to a writable folder"
    )


def test_a_damaged_ctranslate2_conversion_is_made_again(tiny_llama_dir, tmp_path, monkeypatch):
    pytest.importorskip("ctranslate2")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    spans = [([1, 5, 6, 7], [8, 9])]
    want = load_engine(str(tiny_llama_dir), backend="ctranslate2").score_spans(spans).logprobs
    (folder,) = [
        p for p in (tmp_path / "cache" / "cisrank" / "ctranslate2").iterdir() if p.is_dir()
    ]
    assert "model.bin" in read_record(folder, "cisrank-ct2.json")["files"]
    _zero(folder / "model.bin", (folder / "model.bin").stat().st_size // 2, 4096)
    got = load_engine(str(tiny_llama_dir), backend="ctranslate2").score_spans(spans).logprobs
    assert np.allclose(got, want, atol=1e-6, rtol=0)
    recorded = read_record(folder, "cisrank-ct2.json")["files"]["model.bin"]["sha256"]
    assert integrity.sha256_file(folder / "model.bin") == recorded  # converted again


def test_backend_onnx_without_the_onnx_package_is_one_line_naming_the_extra(
    tiny_llama_dir, cache, tmp_path, monkeypatch, capsys
):
    """Before: torch's exporter raised a bare `OnnxExporterError` traceback."""
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` fails as when not installed
    passages = tmp_path / "passages.txt"
    passages.write_text("one passage\n")
    run = _rerank(monkeypatch, capsys, tiny_llama_dir, passages, "float32")
    assert run.code == 2 and "Traceback" not in run.err, run.err
    assert run.last_line == (
        "error: exporting a model to ONNX (--backend onnx) needs the Python package 'onnx', "
        "which is not installed: run `pip install 'cisrank[onnx]'`"
    )
    # and `auto` does not pick an ONNX Runtime it could not export for
    from cisrank.runtimes.auto import resolve_lm_backend as resolve_backend

    monkeypatch.delenv("CISRANK_LM_BACKEND", raising=False)
    monkeypatch.setenv("CISRANK_CPU_BF16", "0")
    assert resolve_backend("auto", "cpu", None) == ("torch", None)
