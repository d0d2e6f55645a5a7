"""What an evaluation leaves behind: a console table, metrics.json, per_query.tsv and a plot."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cisrank.eval.metrics import PerQuery
from cisrank.fileio import atomic_write_bytes, atomic_write_text


def metrics_table(runs: Mapping[str, Mapping[str, float]], title: str = ""):
    """A rich Table with one column per run, one row per measure."""
    from rich.table import Table

    table = Table(title=title or None)
    table.add_column("measure")
    for name in runs:
        table.add_column(name, justify="right")
    measures = list(next(iter(runs.values()))) if runs else []
    for m in measures:
        table.add_row(m, *(f"{vals[m]:.4f}" for vals in runs.values()))
    return table


def write_metrics_json(path: Path, payload: Mapping[str, Any]) -> Path:
    return atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=False) + "\n")


def write_per_query_tsv(
    path: Path, per_run: Mapping[str, PerQuery], topics: Mapping[str, str]
) -> Path:
    """One row per (run, qid) with every measure; the query text last for reading by eye."""
    runs = list(per_run)
    measures = list(per_run[runs[0]]) if runs else []
    lines = ["\t".join(["run", "qid", *measures, "query"])]
    for run in runs:
        values = per_run[run]
        qids = sorted(values[measures[0]], key=_qid_key) if measures else []
        for qid in qids:
            row = [run, qid, *(f"{values[m][qid]:.6f}" for m in measures), topics.get(qid, "")]
            lines.append("\t".join(row))
    return atomic_write_text(path, "\n".join(lines) + "\n")


def _qid_key(qid: str) -> tuple[int, str]:
    return (0, f"{int(qid):020d}") if qid.isdigit() else (1, qid)


def plot_deltas(
    path: Path,
    baseline: Mapping[str, float],
    system: Mapping[str, float],
    measure: str,
    title: str,
) -> Path:
    """Per-query deltas (system minus baseline), sorted, so wins and losses read at a glance."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    qids = sorted(set(baseline) & set(system), key=lambda q: system[q] - baseline[q], reverse=True)
    deltas = [system[q] - baseline[q] for q in qids]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.18 * len(qids) + 2), 4.0), dpi=110)
    colors = ["#2a9d8f" if d > 0 else "#e76f51" if d < 0 else "#999999" for d in deltas]
    ax.bar(range(len(qids)), deltas, color=colors)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(qids)))
    ax.set_xticklabels(qids, rotation=90, fontsize=6)
    ax.set_ylabel(f"delta {measure}")
    ax.set_xlabel("query id")
    mean = sum(deltas) / len(deltas) if deltas else 0.0
    ax.set_title(
        f"{title}\nmean delta {mean:+.4f}, {sum(d > 0 for d in deltas)} up, "
        f"{sum(d < 0 for d in deltas)} down",
        fontsize=9,
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())
