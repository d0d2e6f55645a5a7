"""The figures of `cisrank eval rag` from its per-question records, their paired tests, and what
a run leaves behind: metrics.json, per_question.jsonl, rag.png and the console tables.

Per reranker: MRR of the gold over the whole candidate list and, per k, gold recall@k (the gold
among the top k) and, with a generator, accuracy, EM and F1 of the answers from those k
passages (`answers`). Every pair of rerankers is compared on the same questions, per k: exact
McNemar tests (`cisrank.eval.metrics.mcnemar_exact`) on gold recall, accuracy and EM, which are
right or wrong per question, and a paired randomization test on F1 (`paired_test`); each
reranker is also compared with the closed-book and gold-only answers. The figures can be
recomputed from per_question.jsonl alone (`summarize`).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

from cisrank.data.datasets import json_lines
from cisrank.eval.metrics import discordant, paired_test
from cisrank.eval.report import write_metrics_json
from cisrank.fileio import atomic_write_bytes, atomic_write_text

CLOSED_BOOK = "closed-book"
GOLD_ONLY = "gold-only"
BASELINES = (CLOSED_BOOK, GOLD_ONLY)
BINARY = ("accuracy", "em")
ANSWER_MEASURES = ("accuracy", "em", "f1")


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def _verdicts(records: Sequence[Mapping[str, Any]], name: str, k: str) -> dict[int, Any]:
    """Question index -> verdict of reranker `name` at `k` (or of a baseline, `k` ignored)."""
    out = {}
    for r in records:
        if name in BASELINES:
            got = r.get("baselines", {}).get(name)
        else:
            got = r.get("verdicts", {}).get(name, {}).get(k)
        if got is not None:
            out[int(r["index"])] = got
    return out


def _gold_ranks(records: Sequence[Mapping[str, Any]], name: str) -> dict[int, int]:
    """Question index -> the gold's rank (1 = first) in reranker `name`'s order."""
    return {int(r["index"]): r["order"][name].index(r["gold"]) + 1 for r in records}


def _answers_row(verdicts: Mapping[int, Any]) -> dict[str, Any]:
    vs = list(verdicts.values())
    return {
        "accuracy": _mean([float(v["accuracy"]) for v in vs]),
        "em": _mean([float(v["em"]) for v in vs]),
        "f1": _mean([float(v["f1"]) for v in vs]),
        "answered": len(vs),
    }


def _test(
    k: int, a: str, b: str, measure: str, here: Mapping[int, Any], there: Mapping[int, Any]
) -> dict[str, Any]:
    """One paired test of `a` against `b` on the questions both have: McNemar for a right or
    wrong measure, a paired randomization test for F1."""
    both = sorted(set(here) & set(there))
    out: dict[str, Any] = {"k": k, "a": a, "b": b, "measure": measure, "n": len(both)}
    if measure == "f1":
        x = {str(i): float(here[i]) for i in both}
        y = {str(i): float(there[i]) for i in both}
        t = paired_test(y, x)  # system a against baseline b
        out.update(
            a_value=_mean(list(x.values())),
            b_value=_mean(list(y.values())),
            wins=t["wins"],
            losses=t["losses"],
            p=t["p_randomization"],
        )
        return out
    pairs = [(bool(here[i]), bool(there[i])) for i in both]
    out.update(
        a_value=_mean([float(x) for x, _ in pairs]),
        b_value=_mean([float(y) for _, y in pairs]),
        **discordant(pairs),
    )
    return out


def summarize(
    records: Sequence[Mapping[str, Any]], names: Sequence[str], ks: Sequence[int]
) -> dict[str, Any]:
    """The figures and tests of one run from its per-question records (`names`: the rerankers,
    in the order to report them)."""
    out: dict[str, Any] = {"questions": len(records), "top_k": list(ks), "rerankers": {}}
    hits: dict[tuple[str, int], dict[int, bool]] = {}
    measures: dict[tuple[str, int, str], dict[int, Any]] = {}
    for name in names:
        ranks = _gold_ranks(records, name)
        row: dict[str, Any] = {"mrr": _mean([1.0 / r for r in ranks.values()])}
        for k in ks:
            hits[(name, k)] = {i: r <= k for i, r in ranks.items()}
            cell: dict[str, Any] = {
                "gold_recall": _mean([float(h) for h in hits[(name, k)].values()])
            }
            verdicts = _verdicts(records, name, str(k))
            if verdicts:
                cell.update(_answers_row(verdicts))
                for m in ANSWER_MEASURES:
                    measures[(name, k, m)] = {i: v[m] for i, v in verdicts.items()}
            row[str(k)] = cell
        out["rerankers"][name] = row
    baselines = {}
    for base in BASELINES:
        verdicts = _verdicts(records, base, "")
        if verdicts:
            baselines[base] = _answers_row(verdicts)
            for m in ANSWER_MEASURES:
                measures[(base, 0, m)] = {i: v[m] for i, v in verdicts.items()}
    if baselines:
        out["baselines"] = baselines
    tests = []
    for k in ks:
        for a, b in combinations(names, 2):
            tests.append(_test(k, a, b, "gold_recall", hits[(a, k)], hits[(b, k)]))
            for m in ANSWER_MEASURES:
                if (a, k, m) in measures and (b, k, m) in measures:
                    tests.append(_test(k, a, b, m, measures[(a, k, m)], measures[(b, k, m)]))
        for a in names:
            for base in baselines:
                for m in BINARY:
                    if (a, k, m) in measures:
                        tests.append(
                            _test(k, a, base, m, measures[(a, k, m)], measures[(base, 0, m)])
                        )
    out["tests"] = tests
    return out


def find_test(
    metrics: Mapping[str, Any], k: int, a: str, b: str, measure: str
) -> dict[str, Any] | None:
    """The test of `a` against `b` at `k` on `measure`, whichever way round it was run (then
    seen from `a`: values, wins and losses swapped)."""
    for t in metrics.get("tests", []):
        if (t["k"], t["measure"]) != (k, measure):
            continue
        if (t["a"], t["b"]) == (a, b):
            return dict(t)
        if (t["a"], t["b"]) == (b, a):
            return {
                **t,
                "a": a,
                "b": b,
                "a_value": t["b_value"],
                "b_value": t["a_value"],
                "wins": t["losses"],
                "losses": t["wins"],
            }
    return None


def _p(p: float) -> str:
    return "< 0.0001" if p < 1e-4 else f"{p:.2g}"


def figures_table(metrics: Mapping[str, Any], title: str = "") -> Any:
    """A rich table, one row per reranker and k: MRR (on its first row), gold recall@k and,
    where answered, accuracy, EM and F1; the baselines last."""
    from rich.table import Table

    ks = [str(k) for k in metrics["top_k"]]
    answered = any("accuracy" in row[k] for row in metrics["rerankers"].values() for k in ks)
    table = Table(title=title or None)
    for column in ("reranker", "MRR", "k", "gold recall@k"):
        table.add_column(column, justify="left" if column == "reranker" else "right")
    if answered:
        for column in ("accuracy", "EM", "F1"):
            table.add_column(column, justify="right")
    for name, row in metrics["rerankers"].items():
        for i, k in enumerate(ks):
            cells = [name if i == 0 else "", f"{row['mrr']:.4f}" if i == 0 else "", k]
            cells.append(f"{row[k]['gold_recall']:.4f}")
            if answered:
                cells += [f"{row[k][m]:.4f}" if m in row[k] else "" for m in ANSWER_MEASURES]
            table.add_row(*cells, end_section=i == len(ks) - 1)
    for base, row in metrics.get("baselines", {}).items():
        k = "0" if base == CLOSED_BOOK else "gold"
        table.add_row(base, "", k, "", *(f"{row[m]:.4f}" for m in ANSWER_MEASURES))
    return table


def tests_table(metrics: Mapping[str, Any], versus: str, measure: str = "accuracy") -> Any:
    """A rich table of each reranker against `versus` (and the baselines), per k, on `measure`
    (gold_recall where nothing was answered): wins : losses and the paired p."""
    from rich.table import Table

    names = [n for n in metrics["rerankers"] if n != versus]
    others = [versus, *metrics.get("baselines", {})]
    table = Table(title=f"{measure}: each reranker against another, paired by question")
    table.add_column("reranker")
    table.add_column("k", justify="right")
    for other in others:
        table.add_column(f"vs {other}: wins : losses (p)", justify="right")
    for name in names:
        for k in metrics["top_k"]:
            cells = [name, str(k)]
            for other in others:
                t = find_test(metrics, k, name, other, measure)
                cells.append(f"{t['wins']} : {t['losses']} ({_p(t['p'])})" if t else "")
            table.add_row(*cells)
    return table


def write_per_question(path: Path, records: Sequence[Mapping[str, Any]]) -> Path:
    """per_question.jsonl, one record a line, written atomically."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return atomic_write_text(path, text)


def read_per_question(path: Path) -> list[dict[str, Any]]:
    """The rows of a `per_question.jsonl`, read with the guarded JSON-lines reader."""
    return [row for _, row in json_lines(Path(path), "per-question")]


def plot_rag(path: Path, metrics: Mapping[str, Any], title: str) -> Path:
    """Gold recall@k and, where answered, accuracy@k per reranker (lines over k), the
    closed-book and gold-only accuracy as dashed lines: which reranker's passages answer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = metrics["top_k"]
    rows = metrics["rerankers"]
    answered = any("accuracy" in row[str(k)] for row in rows.values() for k in ks)
    panels = [("gold_recall", "gold recall@k")] + ([("accuracy", "accuracy@k")] if answered else [])
    fig, axes = plt.subplots(
        1, len(panels), figsize=(5.5 * len(panels), 4.0), dpi=110, squeeze=False
    )
    for ax, (measure, label) in zip(axes[0], panels, strict=True):
        for name, row in rows.items():
            values = [row[str(k)].get(measure) for k in ks]
            if all(v is not None for v in values):
                ax.plot(ks, values, marker="o", label=name)
        if measure == "accuracy":
            for base, row in metrics.get("baselines", {}).items():
                ax.axhline(row["accuracy"], linestyle="--", linewidth=0.9, color="grey")
                ax.annotate(base, (ks[0], row["accuracy"]), fontsize=7, va="bottom")
        ax.set_xticks(ks)
        ax.set_xlabel("k (passages given to the generator)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{title} ({metrics['questions']} questions)", fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def write_outputs(
    output: Path, metrics: Mapping[str, Any], records: Sequence[Mapping[str, Any]]
) -> None:
    """metrics.json, per_question.jsonl and rag.png in `output`, each written atomically."""
    output.mkdir(parents=True, exist_ok=True)
    write_per_question(output / "per_question.jsonl", records)
    write_metrics_json(output / "metrics.json", metrics)
    settings = metrics.get("settings", {})
    title = f"{Path(str(settings.get('questions', ''))).name} K={settings.get('candidates', '')} {settings.get('distractors', '')}"
    plot_rag(output / "rag.png", metrics, title.strip())
