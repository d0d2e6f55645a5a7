"""Choose the hybrid's fusion on DL21, then report it on DL19 untouched by the choice.

Inputs are the run files `cisrank eval` wrote (the reranked top 100 with raw scores, and the
first stage, which enters as its rank, `cisrank.fusion.input_order`): fusing them with
`cisrank.fusion.fuse_runs` ranks exactly as
`cisrank eval --reranker hybrid --fuse ... --fusion ...` does (tests/rerank/test_hybrid.py), so
the grid costs seconds instead of a model pass per point. The grid: linear fusion of min-max or
z-scored scores and weighted RRF, over CIS with dense, with the first stage, and with both;
weights on a simplex in steps of 0.1. The selection uses DL21 nDCG@10 alone; DL19 is evaluated
once, with the chosen setting, and printed beside its parts.

`--cv K` asks which *family* of fusion generalizes (the issue: DL21-chosen weights of a
three-part linear min-max fusion kept little of their gain on another set): for each family
(method, normalization, parts), K-fold cross-validation over the selection set's queries picks
the weights on K-1 folds and scores the held-out fold, so each family's CV nDCG@10 is what its
weight choice is worth on unseen queries. The family with the best CV figure (fewer free weights
on a tie within 0.002) is then fitted on the whole selection set and applied once to DL19.

    python bench/hybrid_select.py \
        --select cis=out/eval-dl21-cis-reverse-upr/run.trec --select dense=out/eval-dl21-dense/run.trec \
        --apply cis=out/eval-dl19-cis-reverse-upr/run.trec --apply dense=out/demo-dl19/run.trec
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any

from common import dl19_dir, write_result

from cisrank.data.datasets import load_folder
from cisrank.data.runs import Run
from cisrank.env import data_dir
from cisrank.eval import metrics as M
from cisrank.eval.pipeline import first_stage_run
from cisrank.fusion import fuse_runs, input_order

FIRST_STAGE = "first-stage"
MEASURES = ("nDCG@10", "RR(rel=2)@10", "R(rel=2)@100")
SETTINGS = [("linear", "minmax"), ("linear", "zscore"), ("rrf", "minmax")]


def simplex(n: int, step: float) -> list[tuple[float, ...]]:
    """Weight vectors of n components summing to 1, each a positive multiple of `step`."""
    units = round(1 / step)
    return [
        tuple(c * step for c in combo)
        for combo in itertools.product(range(1, units), repeat=n)
        if sum(combo) == units
    ]


def load_runs(specs: list[str], dataset_dir: Path) -> tuple[dict[str, Run], Any]:
    dataset = load_folder(dataset_dir)
    # the first stage as the served hybrid sees it, its rank (same ranking, same figures)
    runs = {FIRST_STAGE: input_order(first_stage_run(dataset))}
    for spec in specs:
        name, _, path = spec.partition("=")
        runs[name] = Run.read_trec(Path(path), name=name)
    return runs, dataset


def grid(
    runs: dict[str, Run], qrels, step: float, depth: int, anchor: str = "cis"
) -> list[dict[str, Any]]:
    """Every setting's DL21 figures; `anchor` (CIS for the hybrid) is in every combination (it
    is what is being fused)."""
    others = [n for n in runs if n != anchor]
    rows = []
    for r in range(1, len(others) + 1):
        for combo in itertools.combinations(others, r):
            names = [anchor, *combo]
            for weights in simplex(len(names), step):
                for method, norm in SETTINGS:
                    fused = fuse_runs([runs[n] for n in names], weights, method, norm, depth=depth)
                    rows.append(
                        {
                            "fuse": ",".join(
                                f"{n}:{w:g}" for n, w in zip(names, weights, strict=True)
                            ),
                            "fusion": method,
                            "normalize": norm,
                            **M.evaluate(fused, qrels, MEASURES),
                        }
                    )
    return rows


def families(runs: dict[str, Run], anchor: str = "cis") -> list[tuple[tuple[str, ...], str, str]]:
    """(parts, method, normalization) of every family: `anchor` with each non-empty set of
    the others."""
    others = [n for n in runs if n != anchor]
    out = []
    for r in range(1, len(others) + 1):
        for combo in itertools.combinations(others, r):
            for method, norm in SETTINGS:
                out.append(((anchor, *combo), method, norm))
    return out


def cross_validate(
    runs: dict[str, Run],
    qrels,
    step: float,
    depth: int,
    folds: int,
    seed: int = 0,
    anchor: str = "cis",
) -> list[dict[str, Any]]:
    """Per family: mean held-out nDCG@10 over `folds` folds of the queries (weights chosen on
    the others), and the weights chosen on all queries."""
    import random

    qids = sorted(q for q in qrels if q in runs[anchor].rankings)
    random.Random(seed).shuffle(qids)
    parts = [qids[i::folds] for i in range(folds)]
    rows = []
    for names, method, norm in families(runs, anchor):
        per_query: dict[tuple[float, ...], dict[str, float]] = {}
        for weights in simplex(len(names), step):
            fused = fuse_runs([runs[n] for n in names], weights, method, norm, depth=depth)
            per_query[weights] = M.per_query(fused, qrels, ["nDCG@10"])["nDCG@10"]
        held: dict[str, float] = {}
        for k in range(folds):
            train = [q for i, p in enumerate(parts) if i != k for q in p]
            best = max(per_query, key=lambda w: sum(per_query[w][q] for q in train))
            held.update({q: per_query[best][q] for q in parts[k]})
        chosen = max(per_query, key=lambda w: sum(per_query[w].values()))
        rows.append(
            {
                "fuse": ",".join(f"{n}:{w:g}" for n, w in zip(names, chosen, strict=True)),
                "fusion": method,
                "normalize": norm,
                "free_weights": len(names) - 1,
                "cv_nDCG@10": sum(held.values()) / len(held),
                "fit_nDCG@10": sum(per_query[chosen].values()) / len(per_query[chosen]),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--select", action="append", required=True, help="NAME=run.trec on DL21")
    ap.add_argument(
        "--apply",
        action="append",
        default=[],
        help="NAME=run.trec on DL19 (none: the choice is only made, reported nowhere else)",
    )
    ap.add_argument(
        "--anchor",
        default="cis",
        help="the run in every fusion (cis: the hybrid; a teacher's main part to choose a "
        "teacher's fusion)",
    )
    ap.add_argument("--select-data", default="trec-dl21")
    ap.add_argument("--apply-data", default="trec-dl19")
    ap.add_argument("--step", type=float, default=0.1)
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--cv", type=int, default=0, help="choose the family by K-fold CV")
    ap.add_argument("--name", default="hybrid_select")
    args = ap.parse_args()
    root = data_dir() or dl19_dir().parent
    sel_runs, sel = load_runs(args.select, root / args.select_data)
    cv_rows: list[dict[str, Any]] = []
    if args.cv:
        cv_rows = cross_validate(
            sel_runs, sel.qrels, args.step, args.depth, args.cv, anchor=args.anchor
        )
        top = max(r["cv_nDCG@10"] for r in cv_rows)
        near = [r for r in cv_rows if r["cv_nDCG@10"] >= top - 0.002]
        pick = min(near, key=lambda r: (r["free_weights"], -r["cv_nDCG@10"]))
        best = {**pick, "nDCG@10": pick["fit_nDCG@10"]}
        rows = cv_rows
        for r in sorted(cv_rows, key=lambda r: -r["cv_nDCG@10"]):
            print(
                f"CV {r['cv_nDCG@10']:.4f} (fit {r['fit_nDCG@10']:.4f}) {r['fusion']}/"
                f"{r['normalize']} {r['fuse']}"
            )
    else:
        rows = grid(sel_runs, sel.qrels, args.step, args.depth, args.anchor)
        best = max(rows, key=lambda row: row["nDCG@10"])  # first of equals: fewest parts
    select_parts = {n: M.evaluate(run, sel.qrels, MEASURES) for n, run in sel_runs.items()}
    print(f"selected on {args.select_data} ({len(rows)} settings): {best}")
    print(f"{args.select_data} parts: {select_parts}")
    result = {
        "select": {"data": args.select_data, "runs": args.select, "settings": len(rows)},
        "anchor": args.anchor,
        "cv_folds": args.cv,
        "cv": sorted(cv_rows, key=lambda r: -r["cv_nDCG@10"]),
        "chosen": best,
        "select_parts": select_parts,
        "top10_on_select": sorted(rows, key=lambda r: -r.get("nDCG@10", 0))[:10],
    }
    if args.apply:
        result.update(apply_choice(args, best))
    write_result(args.name, result)


def apply_choice(args: argparse.Namespace, best: dict[str, Any]) -> dict[str, Any]:
    """The chosen fusion on the apply set (DL19), once, beside its parts, with paired tests."""
    root = data_dir() or dl19_dir().parent
    app_runs, app = load_runs(args.apply, root / args.apply_data)
    parts = [p.split(":") for p in best["fuse"].split(",")]
    names, weights = [n for n, _ in parts], [float(w) for _, w in parts]
    method, norm = best["fusion"], best["normalize"]
    fused = fuse_runs([app_runs[n] for n in names], weights, method, norm, depth=args.depth)
    per_query = {n: M.per_query(run, app.qrels, MEASURES) for n, run in app_runs.items()}
    per_query["hybrid"] = M.per_query(fused, app.qrels, MEASURES)
    report = {n: M.mean(pq) for n, pq in per_query.items()}
    tests = {
        f"hybrid vs {n}": M.paired_test(per_query[n]["nDCG@10"], per_query["hybrid"]["nDCG@10"])
        for n in app_runs
    }
    command = (
        f"cisrank eval {args.apply_data} --reranker hybrid --fuse {best['fuse']} --fusion {method}"
    )
    for name, figures in report.items():
        print(
            f"{args.apply_data} {name:12s} " + "  ".join(f"{m} {v:.4f}" for m, v in figures.items())
        )
    for name, test in tests.items():
        print(
            f"{name}: delta {test['mean_delta']:+.4f}, randomization p={test['p_randomization']:.3g}"
        )
    print("command:", command)
    return {
        "apply": {"data": args.apply_data, "runs": args.apply, "figures": report},
        "significance": tests,
        "command": command,
    }


if __name__ == "__main__":
    main()
