"""A grid of student trainings, several seeds each, chosen on DL21 dev only.

One pass of the recipe costs about 85 minutes on this 2-core CPU, so the choices of
`make student` (loss, steps) were first made one run at a time, and one run's dev figure moves by
about as much as the choices do: the seed decides the head's initialisation and the order of
the batches. On an H200, eight runs at a time take 1.5 to 4 minutes each (24 runs in about
9 minutes), so this runs a grid of `cisrank distill train` variants, each over several seeds,
several at a time, and ranks them by their mean best DL21 dev nDCG@10 over the seeds (the same
dev evaluator, depth and checkpoint rule as `make student`). DL19 is not touched.

Every run is its own folder under `--out` (`<variant>-s<seed>`) holding the trainer's record,
so a stopped sweep resumes where it was (finished runs are skipped) and `--summarize` alone
rereads them. The summary goes to `--out/summary.json` and `summary.md` after every run.

    python bench/student_sweep.py --out out/sweep --parallel 8 --device cuda \\
        --base-model all-MiniLM-L6-v2 --seeds 12 13 14 [--variants base lr1e-4 ...]
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from cisrank.fileio import atomic_write_text

# `make student`'s recipe (tests/bench checks it against `make -n student`); each variant below
# changes only what it names. The H200 grid of the tenth session ran from the one-pass recipe
# (`epochs1` now); its `epochs2`, the best, is this recipe since.
RECIPE = (
    "--teacher-set teachers/shipped-student-msmarco-top20.parquet --pool out/trainset-shipped "
    "--teacher-fuse cis:0.1,dense:0.9 --teacher-fusion zscore --label-norm query "
    "--lr 2e-4 --max-length 256 --loss margin-mse --train-batch-size 32 --epochs 2 "
    "--eval-steps 156 --dev-dataset trec-dl21 --dev-depth 30"
)
# 19,880 Margin-MSE examples: 622 steps of 32 a pass, dev every 156 steps (eval-steps scales with
# the batch).
VARIANTS = {
    "base": "",
    "lr1e-4": "--lr 1e-4",
    "lr3e-4": "--lr 3e-4",
    "lr5e-4": "--lr 5e-4",
    "bs16": "--train-batch-size 16 --eval-steps 311",
    "bs64": "--train-batch-size 64 --eval-steps 78",
    "fuse-cis0.2": "--teacher-fuse cis:0.2,dense:0.8",
    "fuse-cis0.3": "--teacher-fuse cis:0.3,dense:0.7",
    "fuse-dense": "--teacher-fuse dense:1",
    "epochs1": "--epochs 1",  # the recipe until two passes led the H200 grid
    "epochs3": "--epochs 3",  # two passes' best came late in every seed
    # DL22's 76 queries (BM25 top 100 scored, cut to the recipe's depth) beside MS MARCO's 994
    "dl22": "--teacher-set teachers/shipped-student-msmarco-top20.parquet "
    "--teacher-set teachers/trec-dl22-bm25-top100.parquet --list-depth 20 --eval-steps 167",
}
DEV_KEY = "eval_trec_dl21_ndcg@10"


def _options(text: str) -> dict[str, list[str | None]]:
    """`--name value` and bare `--switch` tokens, in order, each name with all its values: a
    repeated option (`--teacher-set A --teacher-set B`) keeps every one; a switch has [None]."""
    tokens, out = shlex.split(text), {}
    i = 0
    while i < len(tokens):
        name = tokens[i]
        if not name.startswith("--"):
            raise ValueError(f"expected an option, got {name!r} in {text!r}")
        has_value = i + 1 < len(tokens) and not tokens[i + 1].startswith("--")
        out.setdefault(name, []).append(tokens[i + 1] if has_value else None)
        i += 2 if has_value else 1
    return out


def flags(recipe: str, variant: str) -> list[str]:
    """The recipe with the variant's options replacing the recipe's own (every value of a
    repeated one) and adding others."""
    merged = _options(recipe) | _options(variant)
    return [
        x
        for name, values in merged.items()
        for value in values
        for x in (name, value)
        if x is not None
    ]


def run_one(cli: str, out: Path, args: list[str], log: Path) -> Path:
    if (out / "distill-training.json").is_file():
        return out
    cmd = [*shlex.split(cli), "distill", "train", *args, "--out", str(out)]
    with log.open("w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"{out.name}: exit {done.returncode}, see {log}")
    return out


def read_run(folder: Path) -> dict | None:
    path = folder / "distill-training.json"
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    curve = [h[DEV_KEY] for h in record["history"] if DEV_KEY in h]
    return {"best": max(curve), "curve": curve, "seconds": record["train_seconds"]}


def summarize(
    root: Path,
    variants: list[str],
    seeds: list[int],
    recipe: str = RECIPE,
    defined: dict[str, str] | None = None,
) -> list[dict]:
    """Each row names the recipe its variant changed, so a summary stays readable after the
    recipe moves on. `defined`: the variants' flags (default `VARIANTS`)."""
    defined = VARIANTS if defined is None else defined
    rows = []
    for name in variants:
        runs = {s: read_run(root / f"{name}-s{s}") for s in seeds}
        done = {s: r for s, r in runs.items() if r}
        if not done:
            continue
        bests = [r["best"] for r in done.values()]
        rows.append(
            {
                "variant": name,
                "flags": defined.get(name, "?"),
                "recipe": recipe,
                "seeds": sorted(done),
                "mean_best_dev": round(statistics.fmean(bests), 4),
                "sd": round(statistics.stdev(bests), 4) if len(bests) > 1 else None,
                # seeds as strings: the keys JSON keeps
                "best_by_seed": {str(s): round(r["best"], 4) for s, r in done.items()},
                "curves": {str(s): [round(v, 4) for v in r["curve"]] for s, r in done.items()},
                "train_seconds": {str(s): r["seconds"] for s, r in done.items()},
            }
        )
    rows.sort(key=lambda r: -r["mean_best_dev"])
    atomic_write_text(root / "summary.json", json.dumps(rows, indent=1) + "\n")
    lines = [
        "| variant | flags | seeds | mean best DL21 dev | sd | best by seed | dev by eval (first seed) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        first = r["curves"][str(r["seeds"][0])]
        sd = "" if r["sd"] is None else f"{r['sd']:.4f}"
        lines.append(
            f"| {r['variant']} | `{r['flags']}` | {len(r['seeds'])} | {r['mean_best_dev']:.4f} | "
            f"{sd} | "
            f"{' / '.join(f'{v:.4f}' for v in r['best_by_seed'].values())} | "
            f"{' / '.join(f'{v:.4f}' for v in first)} |"
        )
    atomic_write_text(root / "summary.md", "\n".join(lines) + "\n")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variants", nargs="+", default=None, help="names of VARIANTS or --variant")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="a variant of the recipe defined here ('bi=--student bi'); repeat",
    )
    ap.add_argument("--seeds", nargs="+", type=int, default=[12, 13, 14])
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--device", default=None)
    ap.add_argument("--base-model", default="all-MiniLM-L6-v2")
    ap.add_argument("--recipe", default=RECIPE, help="the flags every variant starts from")
    ap.add_argument("--cli", default=f"{sys.executable} -m cisrank.cli", help="how to run cisrank")
    ap.add_argument("--summarize", action="store_true", help="only reread finished runs")
    args = ap.parse_args()
    defined = dict(VARIANTS)
    for spec in args.variant:
        name, sep, text = spec.partition("=")
        if not sep or not name:
            ap.error(f"--variant {spec!r}: expected NAME=FLAGS")
        defined[name] = text
    chosen = args.variants or ([v.partition("=")[0] for v in args.variant] or list(VARIANTS))
    unknown = [v for v in chosen if v not in defined]
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}: one of {', '.join(defined)}")
    args.variants = chosen
    args.out.mkdir(parents=True, exist_ok=True)
    if args.summarize:
        rows = summarize(args.out, args.variants, args.seeds, args.recipe, defined)
        print((args.out / "summary.md").read_text() if rows else "no finished runs")
        return
    # seed by seed: an early stop still leaves every variant measured on the first seeds
    jobs = [(v, s) for s in args.seeds for v in args.variants]
    failures = []
    with ThreadPoolExecutor(args.parallel) as pool:
        futures = {}
        for variant, seed in jobs:
            run_args = [*flags(args.recipe, defined[variant]), "--seed", str(seed)]
            run_args += ["--base-model", args.base_model]
            if args.device:
                run_args += ["--device", args.device]
            out = args.out / f"{variant}-s{seed}"
            log = args.out / f"{variant}-s{seed}.log"
            futures[pool.submit(run_one, args.cli, out, run_args, log)] = out.name
        started = time.perf_counter()
        for fut in as_completed(futures):
            try:
                fut.result()
                print(f"{time.perf_counter() - started:7.0f}s  {futures[fut]} done", flush=True)
            except Exception as exc:  # one failed run must not lose the others
                failures.append(str(exc))
                print(f"FAILED {exc}", flush=True)
            summarize(args.out, args.variants, args.seeds, args.recipe, defined)
    print((args.out / "summary.md").read_text())
    if failures:
        raise SystemExit(f"{len(failures)} runs failed: {failures[0]}")


if __name__ == "__main__":
    main()
