"""The student shipped inside cisrank (`cisrank-student`, the `student` reranker): intact,
within the repository's bound, float16 on disk and float32 in use, and the same reranker under
both of its names."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from cisrank.cli import app
from cisrank.distill.ship import MAX_SHIPPED_BYTES, WEIGHTS
from cisrank.models.integrity import PROVENANCE_FILE, verify_model
from cisrank.models.resolve import resolve_model
from cisrank.models.shipped import shipped_model, student_folder
from cisrank.rerank.registry import load_reranker

DOCS = [
    "Paris is the capital of France.",
    "William Shakespeare wrote Hamlet.",
    "Hamlet is a tragedy set in Denmark.",
]


def test_the_shipped_student_is_intact_small_and_float16_on_disk():
    folder = student_folder()
    assert shipped_model("cisrank-student").folder == folder
    assert resolve_model("cisrank-student") == str(folder) == resolve_model("CISRANK-STUDENT")
    check = verify_model(folder, full=True)
    assert check.status == "intact" and check.shipped, check.problems
    assert sum(p.stat().st_size for p in folder.iterdir()) <= MAX_SHIPPED_BYTES
    provenance = json.loads((folder / PROVENANCE_FILE).read_text())
    assert provenance["format"] == "shipped" and provenance["recipe"] == "make student"
    with safe_open(str(folder / WEIGHTS), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118 - not a dict
    assert dtypes <= {"F16", "I64"} and "F16" in dtypes
    assert json.loads((folder / "config.json").read_text())["dtype"] == "float32"


def test_student_is_the_cross_encoder_with_the_shipped_model():
    student = load_reranker("student", backend="torch", dtype="float32")
    named = load_reranker("cross-encoder", "cisrank-student", backend="torch", dtype="float32")
    default = load_reranker("cross-encoder", backend="torch", dtype="float32")
    assert student.name == "student" and named.name == "cross-encoder"
    assert student.model_name == named.model_name == default.model_name == "cisrank-student"
    assert {p.dtype for p in student.runner.net.parameters()} == {torch.float32}
    scores = student.score("who wrote hamlet", DOCS)
    assert (
        scores == named.score("who wrote hamlet", DOCS) == default.score("who wrote hamlet", DOCS)
    )
    # it ranks the answer first, the passage that only shares the question's words second
    assert [h.index for h in student.rank("who wrote hamlet", DOCS)] == [1, 2, 0]


def test_models_commands_know_the_shipped_student():
    runner = CliRunner()
    rows = json.loads(runner.invoke(app, ["models", "list", "--json"]).stdout)
    row = next(r for r in rows if r["name"] == "cisrank-student")
    assert row["shipped"] and row["state"] == "intact" and row["kind"] == "cross-encoder"
    pulled = runner.invoke(app, ["models", "pull", "cisrank-student"])
    assert pulled.exit_code == 0 and "ships with cisrank: nothing to pull" in pulled.stdout
    verified = runner.invoke(app, ["models", "verify", "cisrank-student"])
    assert verified.exit_code == 0 and "cisrank-student: intact" in verified.stdout


@pytest.mark.parametrize("name", ["cisrank-studen", "cisrank_student"])
def test_a_near_miss_of_the_name_is_not_silently_something_else(name):
    from cisrank.errors import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="did you mean 'cisrank-student' \\(shipped"):
        resolve_model(name)
