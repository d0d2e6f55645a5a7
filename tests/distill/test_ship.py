"""`cisrank distill ship`: a float32 student into the float16 files cisrank ships.

References are independent of the code under test: the expected weights are the source tensors
rounded by torch's own float16 cast, the expected scores come from a CrossEncoder whose float32
weights were rounded through float16 by hand, and determinism is checked by sha256.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from sentence_transformers import CrossEncoder
from typer.testing import CliRunner

from cisrank.cli.app import app
from cisrank.distill.ship import COPIED, WEIGHTS, check_shipped, ship_student
from cisrank.errors import CisrankError, DamagedFileError
from cisrank.models.integrity import PROVENANCE_FILE, sha256_file, verify_model
from cisrank.models.shipped import shipped_root
from cisrank.rerank.registry import load_reranker

PAIRS = [
    ("who wrote hamlet", "William Shakespeare wrote Hamlet."),
    ("who wrote hamlet", "Paris is the capital of France."),
    ("when was the author of hamlet born", "Shakespeare was born in 1564 in Stratford-upon-Avon."),
]


@pytest.fixture(scope="module")
def student_dir(tiny_bert_dir, tmp_path_factory) -> Path:
    """A float32 one-logit CrossEncoder folder, as `cisrank distill train` writes one, with a
    head scaled up so that its logits are not all near zero (rounding must show, if any)."""
    torch.manual_seed(3)
    model = CrossEncoder(str(tiny_bert_dir), num_labels=1, device="cpu")
    with torch.no_grad():
        model.model.classifier.weight.mul_(40.0)
    out = tmp_path_factory.mktemp("student") / "student"
    model.save(str(out))
    (out / "learning_curve.tsv").write_text("step\tnDCG@10\n1\t0.5\n")  # training leftovers
    return out


@pytest.fixture(scope="module")
def shipped_dir(student_dir, tmp_path_factory) -> Path:
    return ship_student(student_dir, tmp_path_factory.mktemp("ship") / "cisrank-student").folder


def test_weights_are_the_float16_rounding_of_the_student(student_dir, shipped_dir):
    source, shipped = load_file(str(student_dir / WEIGHTS)), load_file(str(shipped_dir / WEIGHTS))
    assert sorted(source) == sorted(shipped)
    for name, tensor in source.items():
        assert shipped[name].dtype == torch.float16, name
        assert torch.equal(shipped[name], tensor.to(torch.float16)), name
    # float16 really changed some weights (else the test below could not tell them apart)
    assert any(not torch.equal(shipped[n].float(), t) for n, t in source.items())


def test_only_loader_files_are_copied_byte_for_byte(student_dir, shipped_dir):
    names = {p.name for p in shipped_dir.iterdir()}
    assert names == {WEIGHTS, PROVENANCE_FILE} | {f for f in COPIED if (student_dir / f).is_file()}
    assert "learning_curve.tsv" not in names and "README.md" not in names
    for rel in names - {WEIGHTS, PROVENANCE_FILE}:
        assert (shipped_dir / rel).read_bytes() == (student_dir / rel).read_bytes(), rel
    # the config still says float32: loaders widen the float16 weights
    assert json.loads((shipped_dir / "config.json").read_text())["dtype"] == "float32"


def test_provenance_records_every_file_and_its_source(student_dir, shipped_dir):
    provenance = json.loads((shipped_dir / PROVENANCE_FILE).read_text())
    assert provenance["format"] == "shipped" and provenance["kind"] == "cross-encoder"
    assert provenance["source"][WEIGHTS]["sha256"] == sha256_file(student_dir / WEIGHTS)
    for rel, record in provenance["files"].items():
        assert record == {
            "size": (shipped_dir / rel).stat().st_size,
            "sha256": sha256_file(shipped_dir / rel),
        }
    assert verify_model(shipped_dir, full=True).status == "intact"


def test_deterministic_and_checkable(student_dir, shipped_dir, tmp_path):
    again = ship_student(student_dir, tmp_path / "cisrank-student")
    assert again.files == {p.name: sha256_file(p) for p in sorted(shipped_dir.iterdir())}
    assert check_shipped(student_dir, shipped_dir) == []
    # another student (one weight moved) is not what was shipped
    other = tmp_path / "other"
    other.mkdir()
    for p in student_dir.iterdir():
        (other / p.name).write_bytes(p.read_bytes())
    tensors = load_file(str(other / WEIGHTS))
    tensors["classifier.bias"] = tensors["classifier.bias"] + 1.0
    save_file(tensors, str(other / WEIGHTS), metadata={"format": "pt"})
    diffs = check_shipped(other, shipped_dir)
    assert [d.split(":")[0] for d in diffs] == [PROVENANCE_FILE, WEIGHTS]


def _rounded_reference(student_dir: Path) -> list[float]:
    """The student's float32 logits with every weight rounded through float16 by hand."""
    model = CrossEncoder(str(student_dir), device="cpu", activation_fn=torch.nn.Identity())
    with torch.no_grad():
        for p in model.model.parameters():
            p.copy_(p.to(torch.float16).float())
    return [float(x) for x in model.predict(PAIRS, convert_to_numpy=True)]


def test_the_reranker_widens_to_float32_and_scores_the_rounded_weights(student_dir, shipped_dir):
    reranker = load_reranker("cross-encoder", str(shipped_dir), backend="torch", dtype="float32")
    assert all(p.dtype == torch.float32 for p in reranker.runner.net.parameters())
    got = [s for q, p in PAIRS for s in reranker.score(q, [p])]
    assert got == pytest.approx(_rounded_reference(student_dir), abs=1e-5)
    # and near the float32 student: float16 storage moves a logit by rounding only
    exact = load_reranker("cross-encoder", str(student_dir), backend="torch", dtype="float32")
    want = [s for q, p in PAIRS for s in exact.score(q, [p])]
    assert got == pytest.approx(want, abs=0.05)


def test_damaged_shipped_weights_are_refused_with_the_reinstall_remedy(shipped_dir, tmp_path):
    copy = tmp_path / "cisrank-student"
    copy.mkdir()
    for p in shipped_dir.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    data = bytearray((copy / WEIGHTS).read_bytes())
    data[-100] ^= 0xFF
    (copy / WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(DamagedFileError, match="reinstall cisrank") as raised:
        load_reranker("cross-encoder", str(copy), backend="torch")
    # a copy is not in any clone: it is copied again from the installed one
    assert "git checkout" not in str(raised.value)
    assert (
        f"it is a copy of a model that ships with cisrank: copy it again from the installed one (in {shipped_root()})"
        in str(raised.value)
    )


def test_refuses_what_is_not_a_student(tiny_bert_dir, student_dir, tmp_path):
    with pytest.raises(CisrankError, match="not a trained student folder"):
        ship_student(tmp_path, tmp_path / "out")
    with pytest.raises(CisrankError, match="no classification head"):
        ship_student(tiny_bert_dir, tmp_path / "out")  # a plain BertModel
    big = tmp_path / "big"
    big.mkdir()
    for p in student_dir.iterdir():
        (big / p.name).write_bytes(p.read_bytes())
    tensors = load_file(str(big / WEIGHTS))
    tensors["classifier.bias"] = torch.tensor([70000.0])
    save_file(tensors, str(big / WEIGHTS))
    with pytest.raises(CisrankError, match="beyond float16"):
        ship_student(big, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_cli_ship_and_check(student_dir, tmp_path):
    runner = CliRunner()
    out = tmp_path / "cisrank-student"
    made = runner.invoke(app, ["distill", "ship", "--student", str(student_dir), "--out", str(out)])
    assert made.exit_code == 0, made.output
    assert verify_model(out, full=True).status == "intact"
    same = runner.invoke(
        app, ["distill", "ship", "--student", str(student_dir), "--out", str(out), "--check"]
    )
    assert same.exit_code == 0, same.output
    assert "same sha256" in same.output
    (out / "vocab.txt").write_text("changed\n") if (out / "vocab.txt").exists() else None
    (out / "tokenizer.json").write_text("{}")
    differ = runner.invoke(
        app, ["distill", "ship", "--student", str(student_dir), "--out", str(out), "--check"]
    )
    assert differ.exit_code == 1, differ.output
    assert "tokenizer.json" in differ.output


def test_a_float16_folder_is_computed_in_float32_even_when_its_config_says_float16(
    student_dir, tmp_path
):
    """transformers 5 loads a checkpoint in the type its config names; cisrank asks for float32
    by name, so a student saved in float16 by someone else is not computed in float16 on a CPU."""
    model = CrossEncoder(str(student_dir), device="cpu")
    model.model.half()
    model.save(str(tmp_path / "half"))
    assert json.loads((tmp_path / "half" / "config.json").read_text())["dtype"] == "float16"
    reranker = load_reranker(
        "cross-encoder", str(tmp_path / "half"), backend="torch", dtype="float32"
    )
    assert {p.dtype for p in reranker.runner.net.parameters()} == {torch.float32}
    got = [s for q, p in PAIRS for s in reranker.score(q, [p])]
    assert got == pytest.approx(_rounded_reference(student_dir), abs=1e-5)


@pytest.fixture(scope="module")
def bi_student_dir(tiny_bert_dir, tmp_path_factory) -> Path:
    """A float32 bi-encoder folder as `distill train --student bi` writes one: the transformer
    in the root, mean pooling in `1_Pooling/`, normalisation (no files) in `2_Normalize/`."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    first = Transformer(str(tiny_bert_dir))
    pooling = Pooling(first.get_embedding_dimension(), "mean")
    model = SentenceTransformer(modules=[first, pooling, Normalize()], device="cpu")
    out = tmp_path_factory.mktemp("bi") / "student"
    model.save(str(out))
    (out / "learning_curve.tsv").write_text("step\tnDCG@10\n1\t0.5\n")
    return out


def test_a_bi_encoder_student_ships_with_its_modules_and_serves_as_dense(bi_student_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    shipped = ship_student(bi_student_dir, tmp_path / "cisrank-student")
    provenance = json.loads((shipped.folder / PROVENANCE_FILE).read_text())
    assert provenance["kind"] == "dense"
    assert "1_Pooling/config.json" in provenance["files"] and "learning_curve.tsv" not in str(
        provenance
    )
    assert (shipped.folder / "1_Pooling/config.json").read_bytes() == (
        bi_student_dir / "1_Pooling/config.json"
    ).read_bytes()
    assert shipped.files == {
        p.relative_to(shipped.folder).as_posix(): sha256_file(p)
        for p in sorted(shipped.folder.rglob("*"))
        if p.is_file()
    }
    assert verify_model(shipped.folder, full=True).status == "intact"
    assert check_shipped(bi_student_dir, shipped.folder) == []
    # its scores: the cosine of the float32 bi-encoder with every weight rounded through float16
    ref = SentenceTransformer(str(bi_student_dir), device="cpu")
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.to(torch.float16).float())
    reranker = load_reranker("dense", str(shipped.folder))
    for q, p in PAIRS:
        e = ref.encode([q, p], convert_to_tensor=True, normalize_embeddings=True)
        assert reranker.score(q, [p])[0] == pytest.approx(float(e[0] @ e[1]), abs=1e-5)
