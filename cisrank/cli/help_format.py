"""The help of every `cisrank` command, laid out for the terminal it is read on.

typer's rich help puts each option's long name, short name, negative name, type and range in
columns of their own, so at 80 columns an option's description was left about 17 characters
(`serve --help` ran to 250 lines). Here an option is two columns: its names with its value type
(at most about a third of the width, wrapped inside it when longer) and its description, which
takes the rest; the text is click's own help record of the option (help, default, range, env
var, required), so nothing an option said is lost.

A command whose reranker flags belong to several kinds (`serve`, `eval run`, `rerank`) shows
its own options, then one line per kind pointing to `--help-kind KIND`, which prints that kind's
options: every option is in the main help or on one kind's page.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import typer
from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from typer.core import TyperArgument

OPTIONS_PANEL = "Options"
ARGUMENTS_PANEL = "Arguments"
COMMANDS_PANEL = "Commands"
HELP_KIND = "--help-kind"
KIND_FLAGS = "__cisrank_kind_flags__"
"""The attribute of a verb function that holds its `KindFlags` (set by `reranker_flags`; typer's
callback wrapper copies it onto the click command's callback)."""

NAME_SHARE = 0.34
"""The most of the width the names column takes (wider names wrap inside it): at 80 columns
it leaves every description at least 47 characters (typer's columns left 17)."""


@dataclass(frozen=True)
class KindFlags:
    """A command's reranker flags: `role` names the option that picks the kind (`--reranker`,
    `--teacher`); `kinds` maps each flag's parameter name to the kinds that take it; `summary`
    is each kind's one line (the registry's)."""

    role: str
    kinds: dict[str, tuple[str, ...]]
    summary: dict[str, str]

    @property
    def every_kind(self) -> list[str]:
        seen: dict[str, None] = {}
        for kinds in self.kinds.values():
            seen.update(dict.fromkeys(kinds))
        return list(seen)

    @property
    def collapsed(self) -> bool:
        """Flags of one kind only stay in the main help: a page of its own would hide them
        for nothing."""
        return len(self.every_kind) > 1

    def of(self, kind: str) -> set[str]:
        return {name for name, kinds in self.kinds.items() if kind in kinds}


def _console() -> Console:
    # The terminal's width (COLUMNS where set); rich markup off: help texts hold brackets
    # ([default: 8000]) that are text, not styles.
    return Console(highlight=False, markup=False, emoji=False)


def _paragraphs(text: str) -> Text:
    """A command's help: paragraphs apart, each wrapped by the terminal; one marked with
    click's `\b` keeps its lines."""
    text = text.partition("\f")[0].strip()
    parts = [p.removeprefix("\b\n").removeprefix("\b") for p in text.split("\n\n")]
    return Text("\n\n".join(parts))


def _names_width(console: Console, records: Iterable[tuple[str, str]]) -> int:
    longest = max((len(names) for names, _ in records), default=0)
    return max(8, min(longest, int(console.width * NAME_SHARE)))


def _table(rows: Sequence[tuple[str, str]], width: int, style: str) -> Table:
    table = Table(box=None, show_header=False, expand=True, pad_edge=False, padding=(0, 1))
    table.add_column(style=style, width=width, overflow="fold")
    table.add_column(ratio=1, overflow="fold")
    for names, text in rows:
        table.add_row(names, text)
    return table


def _panel(title: str, table: Table) -> Panel:
    return Panel(table, title=title, title_align="left", border_style="dim")


def _names(param: Any, record_names: str) -> str:
    """An option's names long first (`--reranker, -r <str>`, `--prior / --no-prior`), as the
    eye looks them up; the value type is the help record's."""
    last = record_names.rsplit(" ", 1)[-1]
    metavar = "" if last.startswith("-") or last == record_names else f" {last}"

    def ordered(opts: Iterable[str]) -> str:
        return ", ".join(sorted(opts, key=lambda o: not o.startswith("--")))

    names = ordered(param.opts)
    if param.secondary_opts:
        names += f" / {ordered(param.secondary_opts)}"
    return names + metavar


def _records(params: Iterable[Any], ctx: Any) -> list[tuple[str, str]]:
    """Each parameter's (names, description), the description its help record's (help text,
    default, range, env var, required)."""
    rows = []
    for param in params:
        record = param.get_help_record(ctx)
        if record is None:
            continue
        names, text = record
        if not isinstance(param, TyperArgument):
            names = _names(param, names)
        rows.append((names, text))
    return rows


def _panels(params: Iterable[Any]) -> list[tuple[str, list[Any]]]:
    """Parameters by help panel, in order of first appearance: arguments first, then the
    command's own options, then the others (a reranker kind's, a flag group's)."""
    groups: dict[str, list[Any]] = {ARGUMENTS_PANEL: [], OPTIONS_PANEL: []}
    for param in params:
        if getattr(param, "hidden", False):
            continue
        default = ARGUMENTS_PANEL if isinstance(param, TyperArgument) else OPTIONS_PANEL
        panel = getattr(param, "rich_help_panel", None) or default
        groups.setdefault(panel, []).append(param)
    return [(title, members) for title, members in groups.items() if members]


def _option_panels(console: Console, ctx: Any, params: Iterable[Any]) -> list[RenderableType]:
    panels = [(title, _records(members, ctx)) for title, members in _panels(params)]
    width = _names_width(console, (row for _, rows in panels for row in rows))
    return [_panel(title, _table(rows, width, "bold cyan")) for title, rows in panels if rows]


def _kinds_panel(console: Console, flags: KindFlags) -> Panel:
    """One line per kind: how many options it takes and what it is."""
    rows = []
    for kind in flags.every_kind:
        n = len(flags.of(kind))
        summary = flags.summary.get(kind)
        rows.append((kind, f"{n} option{'s' * (n != 1)}" + (f"; {summary}" if summary else "")))
    width = _names_width(console, rows)
    title = f"{flags.role} KIND: {HELP_KIND} KIND lists its options"
    return _panel(title, _table(rows, width, "bold green"))


def _commands_panel(console: Console, group: Any, ctx: Any) -> Panel | None:
    rows = []
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        if sub is None or sub.hidden:
            continue
        first = (sub.short_help or sub.help or "").partition("\f")[0].split("\n\n")[0]
        rows.append((name, " ".join(first.split())))
    if not rows:
        return None
    return _panel(COMMANDS_PANEL, _table(rows, _names_width(console, rows), "bold cyan"))


def _print(console: Console, parts: Iterable[RenderableType]) -> None:
    console.print(Group(*parts))


def render_help(command: Any, ctx: Any, flags: KindFlags | None = None) -> None:
    """Print `command`'s help: usage, its text, its options by panel (a reranker kind's flags
    collapsed to one line per kind when `flags` says they are), and a group's commands."""
    console = _console()
    parts: list[RenderableType] = [Padding(Text(command.get_usage(ctx)), (1, 1))]
    if command.help:
        parts.append(Padding(_paragraphs(command.help), (0, 1, 1, 1)))
    params = command.get_params(ctx)
    hidden = set()
    if flags is not None and flags.collapsed:
        hidden = set(flags.kinds)
    parts += _option_panels(console, ctx, (p for p in params if p.name not in hidden))
    if hidden and flags is not None:
        parts.append(_kinds_panel(console, flags))
    if hasattr(command, "list_commands"):
        panel = _commands_panel(console, command, ctx)
        if panel is not None:
            parts.append(panel)
    _print(console, parts)


def render_kind_help(command: Any, ctx: Any, flags: KindFlags, kind: str) -> None:
    """Print the options of one reranker kind of `command`: its own and those it shares."""
    console = _console()
    names = flags.of(kind)
    summary = flags.summary.get(kind)
    what = f"{flags.role} {kind}" + (f" ({summary})" if summary else "")
    intro = (
        f"The options of {what}: its own, then those it shares with other kinds. The "
        f"command's other options: {ctx.command_path} --help."
    )
    parts: list[RenderableType] = [
        Padding(Text(command.get_usage(ctx)), (1, 1)),
        Padding(Text(intro), (0, 1, 1, 1)),
    ]
    parts += _option_panels(console, ctx, (p for p in command.get_params(ctx) if p.name in names))
    _print(console, parts)


def show_kind(ctx: typer.Context, value: str | None) -> None:
    """`--help-kind KIND`: print one kind's options and exit, as `--help` does."""
    if value is None or ctx.resilient_parsing:
        return
    flags: KindFlags = getattr(ctx.command.callback, KIND_FLAGS)
    if value not in flags.every_kind:
        raise typer.BadParameter(f"'{value}': give one of {', '.join(flags.every_kind)}")
    render_kind_help(ctx.command, ctx, flags, value)
    raise typer.Exit(0)


def install_help(command: Any, flags: KindFlags | None) -> None:
    """Give `command` this layout for `--help` (its reranker flags collapsed where `flags`
    says so)."""

    def show(ctx: Any, formatter: Any) -> None:
        render_help(command, ctx, flags)

    command.format_help = show
