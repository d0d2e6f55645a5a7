"""The statistics of a `bench/rag_nq.py` result, as the tables of `bench/RESULTS.md`.

`rag_nq.py` records every question (rotation scores, the curvature order, each mode's answer and
whether it holds a gold answer); this reads those records back and says how far the figures can
be trusted on the sample at hand: standard errors of the position means, an exact binomial test
of "curvature puts the gold first" against chance 1/K, and exact McNemar tests between
arrangements answered on the same questions (paired: the same question under two prompts, so
only the questions where they disagree carry information). No model runs here.

    python bench/rag_nq_report.py bench/results/rag_nq_related_k10.json \\
        --baselines bench/results/rag_nq_random_k10.json

`--baselines` takes `closed_book` and `gold_only` from another result on the same questions:
neither prompt holds a distractor, so they are the same generations whatever the distractors.
`--against` compares each mode with the same mode of another result (K = 20 against K = 10,
related against random distractors), paired by question, on the questions both ran.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cisrank.eval.metrics import discordant as paired
from cisrank.eval.metrics import mcnemar_exact  # noqa: F401 (the report's test reads it here)

BASELINE_MODES = ("closed_book", "gold_only")

# (mode, the row it is tested against): each arrangement against the one it claims to improve
COMPARISONS = (
    ("reverse", "ranked"),
    ("pmi_rotation", "ranked"),
    ("curvature", "ranked"),
    ("noise", "reverse"),
    ("avg_ens", "closed_book"),
    ("replug", "gold_only"),
    ("leens", "avg_ens"),
    ("clehe", "leens"),
)
ROW_ORDER = (
    "closed_book",
    "gold_only",
    "ranked",
    "reverse",
    "pmi_rotation",
    "curvature",
    "noise",
    "avg_ens",
    "replug",
    "leens",
    "clehe",
)


def binomial_sf(successes: int, n: int, p: float) -> float:
    """P(X >= successes) for X ~ Binomial(n, p), summed exactly (n is a few hundred)."""
    return min(
        1.0, sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(successes, n + 1))
    )


def gold_position_loglik(rec: dict[str, Any], k: int) -> np.ndarray:
    """Question log-likelihood with the gold at each position: rotation r of the input order
    puts the gold (input position g) at (g - r) mod K (seed 000 Eq. 9)."""
    out = np.empty(k)
    for r, lr in enumerate(rec["rotation_loglik"]):
        out[(rec["gold_input_position"] - r) % k] = lr
    return out


def position_stats(records: Sequence[dict[str, Any]], k: int) -> dict[str, Any]:
    """(a): the mean by position with its standard error, and two paired contrasts."""
    table = np.array([gold_position_loglik(r, k) for r in records if r.get("rotation_loglik")])
    n = len(table)
    if n == 0:
        return {"questions": 0}
    sd = table.std(axis=0, ddof=1) if n > 1 else np.zeros(k)
    out = {"questions": n, "mean": table.mean(axis=0).tolist(), "se": (sd / math.sqrt(n)).tolist()}
    if k < 3:  # no middle to compare the ends with
        return out
    middle = table[:, 1 : k - 1]
    lowest = 1 + int(np.argmin(middle.mean(axis=0)))
    first_vs_low = table[:, 0] - table[:, lowest]
    return {
        **out,
        "last_above_middle": float(np.mean(table[:, k - 1] > middle.mean(axis=1))),
        "lowest_middle_position": lowest,
        "first_minus_lowest": float(first_vs_low.mean()),
        "first_minus_lowest_se": float(first_vs_low.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0,
        "first_above_lowest": float(np.mean(first_vs_low > 0)),
    }


def order_stats(records: Sequence[dict[str, Any]], k: int) -> dict[str, Any]:
    """(b): where curvature and the PMI rotation put the gold, against chance 1/K."""
    scored = [r for r in records if r.get("rotation_loglik")]
    n = len(scored)
    first = sum(r["curvature_order"][0] == r["gold_input_position"] for r in scored)
    top2 = sum(r["gold_input_position"] in r["curvature_order"][:2] for r in scored)
    # d_j's score is l(rot_j) + l(rot_{j+1}), and rot_{g+1} is the rotation that puts the gold
    # last: a model whose U is steeper at the end credits the gold's successor with it too, and
    # the successor also collects l(rot_{g+2}) (the gold second to last) where the gold collects
    # l(rot_g) (the gold first)
    successor = sum(r["curvature_order"][0] == (r["gold_input_position"] + 1) % k for r in scored)
    # the PMI rotation r* = argmax l puts the gold at (g - r*) mod K
    pmi_pos = [
        (r["gold_input_position"] - int(np.argmax(r["rotation_loglik"]))) % k for r in scored
    ]
    return {
        "questions": n,
        "curvature_first": first,
        "curvature_first_p": binomial_sf(first, n, 1 / k),
        "curvature_top2": top2,
        "curvature_successor_first": successor,
        "pmi_rotation_gold_last": sum(p == k - 1 for p in pmi_pos),
        "pmi_rotation_gold_first": sum(p == 0 for p in pmi_pos),
        "bm25_gold_first": sum(r["gold_input_position"] == 0 for r in records),
        "bm25_questions": len(records),
    }


def accuracy_stats(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """(c): accuracy per mode over the questions that ran it, and the paired tests."""
    modes = [m for m in ROW_ORDER if any(m in r["answers"] for r in records)]
    rows: dict[str, Any] = {}
    for m in modes:
        ran = [r["answers"][m]["correct"] for r in records if m in r["answers"]]
        rows[m] = {"questions": len(ran), "accuracy": sum(ran) / len(ran)}
    for m, ref in COMPARISONS:
        if m not in rows or ref not in rows:
            continue
        pairs = [
            (r["answers"][m]["correct"], r["answers"][ref]["correct"])
            for r in records
            if m in r["answers"] and ref in r["answers"]
        ]
        rows[m].update(vs=ref, **paired(pairs))
    return rows


def against_stats(
    records: Sequence[dict[str, Any]], other: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """Each mode against the same mode of another result (another K, other distractors), on the
    questions both ran it for: the other's accuracy on exactly those questions and McNemar p.
    The distractor-free baselines are left out: their prompts are the same in both."""
    by_question = {int(r["question"]): r["answers"] for r in other}
    rows: dict[str, Any] = {}
    for m in ROW_ORDER:
        if m in BASELINE_MODES:
            continue
        pairs = [
            (r["answers"][m]["correct"], there[m]["correct"])
            for r in records
            if m in r["answers"] and m in (there := by_question.get(int(r["question"]), {}))
        ]
        if pairs:
            rows[m] = {
                "questions": len(pairs),
                "accuracy_here": sum(x for x, _ in pairs) / len(pairs),
                "accuracy_there": sum(y for _, y in pairs) / len(pairs),
                **paired(pairs),
            }
    return rows


def with_baselines(
    records: Sequence[dict[str, Any]], baselines: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Copies of `records` with the distractor-free answers of the same questions added."""
    by_question = {int(r["question"]): r for r in baselines}
    out = []
    for rec in records:
        rec = {**rec, "answers": dict(rec["answers"])}
        other = by_question.get(int(rec["question"]))
        for m in BASELINE_MODES:
            if other is not None and m in other["answers"] and m not in rec["answers"]:
                rec["answers"][m] = other["answers"][m]
        out.append(rec)
    return out


def block_report(
    records: Sequence[dict[str, Any]], k: int, against: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    rep = {
        "positions": position_stats(records, k),
        "orders": order_stats(records, k),
        "accuracy": accuracy_stats(records),
    }
    if against:
        rep["against"] = against_stats(records, against)
    return rep


def _p(p: float) -> str:
    return "< 0.0001" if p < 1e-4 else f"{p:.2g}"


def markdown(key: str, k: int, rep: dict[str, Any], against_label: str = "") -> str:
    lines = [f"**{key}**", ""]
    pos = rep["positions"]
    if pos["questions"]:
        n = pos["questions"]
        lines += [
            f"(a) n = {n}; mean per-token log p(q | prompt) by gold position (0 = first):",
            "",
            "| gold at | " + " | ".join(str(i) for i in range(k)) + " |",
            "|---|" + "---|" * k,
            "| mean | " + " | ".join(f"{v:.3f}" for v in pos["mean"]) + " |",
            "| SE | " + " | ".join(f"{v:.3f}" for v in pos["se"]) + " |",
            "",
        ]
        if "last_above_middle" in pos:
            lines += [
                f"gold last above the mean of the middle positions in"
                f" {pos['last_above_middle']:.1%}; first minus the lowest middle position"
                f" ({pos['lowest_middle_position']}): {pos['first_minus_lowest']:.3f}"
                f" (SE {pos['first_minus_lowest_se']:.3f}), first higher in"
                f" {pos['first_above_lowest']:.1%}.",
                "",
            ]
        o = rep["orders"]
        lines += [
            f"(b) curvature puts the gold first in {o['curvature_first']}/{o['questions']}"
            f" ({o['curvature_first'] / o['questions']:.1%}; chance {1 / k:.1%},"
            f" binomial p = {o['curvature_first_p']:.2g}), in its top two in"
            f" {o['curvature_top2'] / o['questions']:.1%}, and the passage after the gold in"
            f" the input order first in {o['curvature_successor_first'] / o['questions']:.1%};"
            f" pmi_rotation puts the gold last in"
            f" {o['pmi_rotation_gold_last'] / o['questions']:.1%} and first in"
            f" {o['pmi_rotation_gold_first'] / o['questions']:.1%}; BM25's input order has it"
            f" first in {o['bm25_gold_first'] / o['bm25_questions']:.1%}.",
            "",
        ]
    lines += [
        "(c) accuracy over the questions that ran each mode (wins : losses = the discordant",
        "questions, right here and wrong in the row named, and the reverse):",
        "",
        "| mode | n | accuracy | vs | wins : losses | McNemar p |",
        "|---|---|---|---|---|---|",
    ]
    for m, row in rep["accuracy"].items():
        test = (
            f"{row['vs']} | {row['wins']} : {row['losses']} | {_p(row['p'])}"
            if "vs" in row
            else "| |"
        )
        lines.append(f"| {m} | {row['questions']} | {row['accuracy']:.3f} | {test} |")
    if rep.get("against"):
        lines += [
            "",
            f"the same mode in {against_label or 'the other result'}, paired by question"
            " (here and there: the accuracies on the n questions both ran):",
            "",
            "| mode | n | here | there | wins : losses | McNemar p |",
            "|---|---|---|---|---|---|",
        ]
        for m, row in rep["against"].items():
            lines.append(
                f"| {m} | {row['questions']} | {row['accuracy_here']:.3f} |"
                f" {row['accuracy_there']:.3f} | {row['wins']} : {row['losses']} | {_p(row['p'])} |"
            )
    return "\n".join(lines)


def all_records(path: Path | None) -> list[dict[str, Any]]:
    """Every per-question record of a result file, whatever its blocks; none without a file."""
    if path is None:
        return []
    blocks = json.loads(path.read_text())["results"]["per_question"].values()
    return [rec for recs in blocks for rec in recs]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result", type=Path, help="a bench/rag_nq.py result file")
    ap.add_argument("--baselines", type=Path, help="closed_book / gold_only from this result")
    ap.add_argument(
        "--against",
        type=Path,
        help="each mode against the same mode of this result (another K or distractor kind),"
        " paired by question",
    )
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    per_question = json.loads(args.result.read_text())["results"]["per_question"]
    base = all_records(args.baselines)
    other = all_records(args.against)
    label = args.against.stem if args.against else ""
    reports = {}
    for key, recs in per_question.items():
        k = int(key.rsplit("_k", 1)[1])
        reports[key] = block_report(with_baselines(recs, base) if base else recs, k, other)
        if not args.json:
            print(markdown(key, k, reports[key], label), end="\n\n")
    if args.json:
        json.dump(reports, sys.stdout, indent=1)
        print()
    return reports


if __name__ == "__main__":
    main()
