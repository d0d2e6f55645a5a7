"""Prompt templates of every causal-LM score, as data: named strings with slots, cut into ids.

One module for the CIS templates below and the pieces that RAG context templates
(`cisrank.context.templates`) share with them: `field_names` (the one checker of a format
string's fields) and `chat_turns` (the one renderer of a tokenizer's chat template).

Two directions estimate the same CIS (by Bayes, log p(K|Q) - log p(K) = log p(Q|K) - log p(Q)):

- *forward* templates hold `{query}`: the passage K is scored right after the templated query
  (`plain` = `"{query}"`, `qa` = `"Question: {query}\\nAnswer:"`, the paper's "Q: Q A: K");
- *reverse* (passage-first) templates hold `{passage}` and end with `{query}`: the query is scored
  after the templated passage (`upr` = the UPR question-generation prompt of Sachan et al. 2022).

`chat` in either direction renders the tokenizer's own chat template (instruction-tuned models
were trained on it): the query as the user's turn and the passage as the assistant's answer, or
the passage with a request for a question as the user's turn and the query as the answer.

Text is never joined across a slot: the pieces around a slot are tokenized on their own and the
ids concatenated, so a BPE merge at a junction cannot change the tokens of the scored span. A
space just before the final `{query}` slot moves into the query (`" " + query`), which is how a
tokenizer would have split the running text.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cisrank.errors import CisrankError

FORWARD_TEMPLATES: dict[str, str] = {"plain": "{query}", "qa": "Question: {query}\nAnswer:"}
REVERSE_TEMPLATES: dict[str, str] = {
    "upr": "Passage: {passage}\nPlease write a question based on this passage.\nQuestion: {query}",
}
CHAT = "chat"
_REVERSE_REQUEST = "{passage}\n\nPlease write a question based on this passage."
_QUERY_SENTINEL, _PASSAGE_SENTINEL = "\x00CISRANK_QUERY\x00", "\x00CISRANK_PASSAGE\x00"


def field_names(fmt: str, what: str) -> list[str]:
    """The named fields of a format string, in order (repeats kept). A field that is not a plain
    name (`{0}`, `{a.b}`, `{x!r}`, `{x:>3}`) or a stray brace is an error naming `what`."""
    try:
        parsed = list(string.Formatter().parse(fmt))
    except ValueError as exc:
        raise CisrankError(f"{what}: {exc}; write literal braces as '{{{{' and '}}}}'") from None
    names = []
    for _, name, spec, conv in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conv:
            shown = name + ("!" + conv if conv else "") + (":" + spec if spec else "")
            raise CisrankError(
                f"{what}: field '{{{shown}}}' is not a plain name; write literal braces as "
                "'{{' and '}}'"
            )
        names.append(name)
    return names


def _check_slots(template: str, slots: tuple[str, ...], what: str) -> None:
    allowed = ", ".join("{" + s + "}" for s in slots)
    try:
        names = field_names(template, f"{what} template {template!r}")
    except CisrankError as exc:
        raise CisrankError(f"{exc} (it may hold {allowed})") from None
    other = [n for n in names if n not in slots]
    if other:
        raise CisrankError(
            f"{what} template {template!r} has braces other than {allowed} ('{{{other[0]}}}'): "
            "double literal braces as '{{' and '}}'"
        )


def resolve_forward(template: str) -> str:
    """A named forward template or a custom string holding `{query}` (`chat` is resolved with
    the tokenizer, by `render_chat`)."""
    if template in FORWARD_TEMPLATES:
        return FORWARD_TEMPLATES[template]
    if template == CHAT:
        return template
    if "{query}" not in template:
        raise CisrankError(
            f"template {template!r} is neither a named template "
            f"({', '.join([*FORWARD_TEMPLATES, CHAT])}) nor a string holding '{{query}}'"
        )
    _check_slots(template, ("query",), "query")
    return template


def resolve_reverse(template: str) -> str:
    """A named passage-first template or a custom string holding `{passage}` and ending with
    `{query}` (the scored span must come last)."""
    if template in REVERSE_TEMPLATES:
        return REVERSE_TEMPLATES[template]
    if template == CHAT:
        return template
    if "{passage}" not in template or not template.endswith("{query}"):
        raise CisrankError(
            f"reverse template {template!r} is neither a named one "
            f"({', '.join([*REVERSE_TEMPLATES, CHAT])}) nor a string holding '{{passage}}' and "
            "ending with '{query}'"
        )
    if template.index("{passage}") > template.index("{query}"):
        raise CisrankError(
            f"reverse template {template!r}: '{{passage}}' must come before '{{query}}'"
        )
    _check_slots(template, ("passage", "query"), "reverse")
    return template


def chat_turns(
    tokenizer: Any,
    messages: Sequence[dict[str, str]],
    *,
    add_generation_prompt: bool = False,
    bos_text: str | None = None,
    what: str = "chat",
    hint: str = "",
) -> str:
    """The tokenizer's chat template rendered as text, a leading BOS text dropped (every score
    adds BOS itself): the one chat renderer of CIS and context templates alike. `what` and
    `hint` name the option in errors."""
    if not getattr(tokenizer, "chat_template", None):
        raise CisrankError(f"{what}: this tokenizer has no chat template{hint}")
    text = tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
    )
    if not isinstance(text, str):
        raise CisrankError(f"{what}: the chat template did not render the messages")
    if bos_text and text.startswith(bos_text):
        text = text[len(bos_text) :]
    return text


def render_chat(tokenizer: Any, reverse: bool, bos_text: str | None) -> str:
    """The tokenizer's chat template as a format string with `{query}` (and `{passage}`), cut
    after the slot that is scored; a leading BOS text is dropped (the scorer adds BOS itself)."""
    if reverse:
        user = _REVERSE_REQUEST.replace("{passage}", _PASSAGE_SENTINEL)
        messages = [
            {"role": "user", "content": user},
            {"role": "assistant", "content": _QUERY_SENTINEL},
        ]
        cut = _QUERY_SENTINEL
    else:
        messages = [
            {"role": "user", "content": _QUERY_SENTINEL},
            {"role": "assistant", "content": _PASSAGE_SENTINEL},
        ]
        cut = _PASSAGE_SENTINEL
    text = chat_turns(tokenizer, messages, bos_text=bos_text, what="template 'chat'")
    if cut not in text:
        raise CisrankError("template 'chat': the chat template did not render the messages")
    text = text[: text.index(cut) + len(cut)]
    text = text.replace("{", "{{").replace("}", "}}")
    text = text.replace(_QUERY_SENTINEL, "{query}").replace(_PASSAGE_SENTINEL, "{passage}")
    return text[: -len("{passage}")] if not reverse else text


@dataclass(frozen=True)
class ReverseTemplate:
    """A passage-first template cut at its slots: text before the passage, text between the
    passage and the query, and whether the query takes a leading space."""

    before: str
    between: str
    space_before_query: bool

    @classmethod
    def parse(cls, template: str) -> ReverseTemplate:
        before, rest = template.split("{passage}", 1)
        between = rest[: -len("{query}")]
        space = between.endswith(" ")
        return cls(
            before.replace("{{", "{").replace("}}", "}"),
            (between[:-1] if space else between).replace("{{", "{").replace("}}", "}"),
            space,
        )

    def ids(
        self, encode: Callable[[str], list[int]], bos: int, passage: list[int], query: str
    ) -> tuple[list[int], list[int]]:
        """(context, target): `[BOS, before, passage, between]` and the query's ids."""
        context = [bos, *encode(self.before), *passage, *encode(self.between)]
        return context, encode((" " if self.space_before_query else "") + query)
