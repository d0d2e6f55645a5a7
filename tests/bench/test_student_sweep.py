"""bench/student_sweep.py: how a variant's flags replace the recipe's, that finished runs are
not rerun, and the summary's arithmetic (mean and sd of each variant's best dev over seeds)."""

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def sweep(bench_script):
    return bench_script("student_sweep")


def test_a_variant_replaces_the_recipes_values_in_place_and_adds_its_own(sweep):
    got = sweep.flags("--lr 2e-4 --epochs 1 --pool 'a b'", "--lr 1e-4 --seed 3 --keep-checkpoints")
    assert got == [
        *("--lr", "1e-4", "--epochs", "1", "--pool", "a b"),
        *("--seed", "3", "--keep-checkpoints"),
    ]
    with pytest.raises(ValueError, match="expected an option"):
        sweep.flags("--lr 2e-4 stray", "")


def test_a_repeated_option_keeps_every_value_until_a_variant_names_it(sweep):
    recipe = "--teacher-set a.parquet --pool p --teacher-set b.parquet"
    assert sweep.flags(recipe, "--lr 1e-4") == [
        *("--teacher-set", "a.parquet", "--teacher-set", "b.parquet", "--pool", "p"),
        *("--lr", "1e-4"),
    ]
    assert sweep.flags(recipe, "--teacher-set c.parquet") == [
        *("--teacher-set", "c.parquet", "--pool", "p"),
    ]


def test_every_variant_is_the_recipe_with_one_change(sweep):
    base = sweep.flags(sweep.RECIPE, "")
    assert sweep.flags(sweep.RECIPE, sweep.VARIANTS["base"]) == base
    for name, variant in sweep.VARIANTS.items():
        if name == "dl22":
            continue
        got = sweep.flags(sweep.RECIPE, variant)
        assert len(got) == len(base), name  # nothing added: each variant changes a recipe value
        assert sum(a != b for a, b in zip(got, base, strict=True)) <= 2, name


def test_the_dl22_variant_adds_the_dl22_set_at_the_recipes_depth_and_nothing_else(sweep):
    """The one variant that changes the data: MS MARCO's set kept, DL22's added, both cut to the
    recipe's 20 passages a query, dev at the same fractions of the longer run."""
    base = sweep._options(" ".join(sweep.flags(sweep.RECIPE, "")))
    got = sweep._options(" ".join(sweep.flags(sweep.RECIPE, sweep.VARIANTS["dl22"])))
    assert got.pop("--teacher-set") == [
        "teachers/shipped-student-msmarco-top20.parquet",
        "teachers/trec-dl22-bm25-top100.parquet",
    ]
    assert base.pop("--teacher-set") == ["teachers/shipped-student-msmarco-top20.parquet"]
    assert got.pop("--list-depth") == ["20"]
    assert (got.pop("--eval-steps"), base.pop("--eval-steps")) == (["167"], ["156"])
    assert got == base


def _finished(folder: Path, curve: list[float], seconds: float = 60.0) -> None:
    folder.mkdir(parents=True)
    history = [{"loss": 1.0, "step": 10}]
    history += [{sweep_key(): v, "step": 20 * (i + 1)} for i, v in enumerate(curve)]
    record = {"history": history, "train_seconds": seconds}
    (folder / "distill-training.json").write_text(json.dumps(record))


def sweep_key() -> str:
    return "eval_trec_dl21_ndcg@10"


def test_summary_ranks_variants_by_mean_best_dev_over_finished_seeds(sweep, tmp_path):
    _finished(tmp_path / "base-s12", [0.50, 0.55, 0.54])
    _finished(tmp_path / "base-s13", [0.52, 0.53, 0.51])
    _finished(tmp_path / "lr1e-4-s12", [0.56, 0.57, 0.49])
    (tmp_path / "lr1e-4-s13").mkdir()  # stopped mid-run: no record, not counted
    rows = sweep.summarize(tmp_path, ["base", "lr1e-4", "bs16"], [12, 13])
    assert [r["variant"] for r in rows] == ["lr1e-4", "base"]  # bs16 never ran: no row
    lr, base = rows
    assert lr["seeds"] == [12] and lr["mean_best_dev"] == 0.57 and lr["sd"] is None
    assert base["mean_best_dev"] == round(statistics.fmean([0.55, 0.53]), 4)
    assert base["sd"] == round(statistics.stdev([0.55, 0.53]), 4)
    assert lr["recipe"] == base["recipe"] == sweep.RECIPE
    table = (tmp_path / "summary.md").read_text().splitlines()
    assert table[2].startswith("| lr1e-4 | `--lr 1e-4` | 1 | 0.5700 |  | 0.5700 |")
    assert table[3].endswith("| 0.5500 / 0.5300 | 0.5000 / 0.5500 / 0.5400 |")
    assert json.loads((tmp_path / "summary.json").read_text()) == rows


def test_a_finished_run_is_not_rerun_and_a_failed_one_names_its_log(sweep, tmp_path):
    _finished(tmp_path / "done", [0.5])
    # `false` as the CLI fails whenever it is run: the finished run must not run it
    assert sweep.run_one("false", tmp_path / "done", [], tmp_path / "done.log") == tmp_path / "done"
    with pytest.raises(RuntimeError, match=r"todo\.log"):
        sweep.run_one("false", tmp_path / "todo", [], tmp_path / "todo.log")


def test_the_recipe_is_make_students(sweep):
    """The sweep varies what `make student` trains: its flags, read from `make -n student`,
    are the recipe's, plus the base model, the seed and the output the sweep sets per run."""
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    root = Path(__file__).resolve().parents[2]
    dry = subprocess.run(["make", "-n", "student"], cwd=root, capture_output=True, text=True)
    lines = dry.stdout.replace("\\\n", " ").splitlines()
    train = next(line for line in lines if "distill train" in line)
    made = sweep._options(train.split("distill train", 1)[1])
    assert made.pop("--base-model") == ["all-MiniLM-L6-v2"]
    assert made.pop("--seed") == ["12"] and made.pop("--out") == ["out/student"]
    assert made == sweep._options(sweep.RECIPE)


def test_variants_defined_on_the_command_line_are_summarized_with_their_flags(sweep, tmp_path):
    _finished(tmp_path / "bi-s12", [0.58, 0.61])
    root = Path(__file__).resolve().parents[2]
    args = ["--out", str(tmp_path), "--seeds", "12", "--variant", "bi=--student bi-encoder"]
    done = subprocess.run(
        [sys.executable, str(root / "bench" / "student_sweep.py"), *args, "--summarize"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (row,) = json.loads((tmp_path / "summary.json").read_text())
    assert (row["variant"], row["flags"], row["mean_best_dev"]) == (
        "bi",
        "--student bi-encoder",
        0.61,
    )
    bad = subprocess.run(
        [sys.executable, str(root / "bench" / "student_sweep.py"), *args, "--variants", "nope"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "unknown variant(s) nope" in bad.stderr
