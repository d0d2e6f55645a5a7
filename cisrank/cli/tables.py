"""The one table a ranked list is printed as (`cisrank rerank`, `cisrank search`)."""

from __future__ import annotations

from collections.abc import Iterable


def print_ranking(
    title: str, id_header: str, text_header: str, rows: Iterable[tuple[str, float, str]]
) -> None:
    """Rank, id, score (4 decimals) and the text cut to 100 characters, best first."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("rank", justify="right")
    table.add_column(id_header, justify="left")
    table.add_column("score", justify="right")
    table.add_column(text_header, justify="left")
    for r, (ident, score, text) in enumerate(rows, 1):
        table.add_row(
            str(r), ident, f"{score:.4f}", text if len(text) <= 100 else text[:97] + "..."
        )
    Console().print(table)
