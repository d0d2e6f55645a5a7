"""Prompt templates of RAG contexts, as data: an instruction with `{documents}` and `{question}`.

A template is a format string with two required fields, `{documents}` (the rendered passages,
joined) and `{question}` (the scored span of the gauge), in that order: the context comes before
the question, as in every method here (the "context-first" template of "Pointwise Mutual
Information as a Performance Gauge for Retrieval-Augmented Generation" and "Likelihood as a
Performance Gauge for Retrieval-Augmented Generation", Liu et al. 2025; [I, documents..., Q] in
"The Power of Noise: Redefining Retrieval for RAG Systems", Cuconasu et al. 2024, §4.4). Any
other field must be given a value by name (`fields={"name": "value"}`); a field without one is an
error naming it.

Each passage is rendered by a document format with the fields `{index}` (1-based position in the
prompt), `{title}`, `{text}` and `{id}`, by default `Document [{index}](Title: {title}) {text}`
(the lost-in-the-middle format the PMI papers and the Power-of-Noise code use), and the rendered
passages are joined by the template's separator.

Named templates (the exact wording of the papers and their public code):

- `qa`: the NQ-Open prompt of Liu et al. (App. D, Fig. 7 of both gauge papers; the
  lost-in-the-middle code);
- `noise`: the extraction prompt of the Power-of-Noise code (`build_qa_prompt`; its brackets hold
  the corpus index, here the position like the other templates, or `{id}` with a custom document
  format);
- `kv`: the key-value retrieval prompt (lost in the middle; Pointwise Mutual Information as a
  Performance Gauge, App. D, Fig. 9): each passage is a record, its title the key and its text the
  value, rendered as one JSON object; the question is the key looked up;
- `entropy`: the naive-RAG prompt of "Entropy-Based Decoding for Retrieval-Augmented Large
  Language Models" (App. A.3).

Chat models: `chat=True` puts the whole rendered prompt in the user's turn of the tokenizer's chat
template and opens the assistant's turn (`add_generation_prompt`), as the papers do for instruct
models (Pointwise Mutual Information as a Performance Gauge, App. D).

Rendering returns the text cut at the question (`before`, `question`, `after`): the ids are
`[BOS] + T(before) + T(question) + T(after)`, each piece tokenized on its own (the house rule of
`cisrank.lm.prompts`: a BPE merge at a junction cannot change the scored span), and a space
just before the question moves into the question (`" " + question`), which is how a tokenizer
splits the running text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cisrank.data.types import Passage
from cisrank.errors import CisrankError
from cisrank.lm.prompts import chat_turns, field_names

DOCUMENT_FORMAT = "Document [{index}](Title: {title}) {text}"
DOCUMENT_FIELDS = ("index", "title", "text", "id")
REQUIRED_FIELDS = ("documents", "question")
_SENTINEL = "\x00CISRANK_QUESTION\x00"


@dataclass(frozen=True)
class ContextTemplate:
    """A RAG prompt as data: `text` with `{documents}` before `{question}`, the per-passage
    `document` format and the `separator` between rendered passages."""

    name: str
    text: str
    document: str = DOCUMENT_FORMAT
    separator: str = "\n"
    fields: Mapping[str, str] = field(default_factory=dict)
    single_document: str | None = None

    def __post_init__(self) -> None:
        names = field_names(self.text, f"template {self.name!r}")
        for required in REQUIRED_FIELDS:
            if names.count(required) != 1:
                raise CisrankError(
                    f"template {self.name!r} must hold '{{{required}}}' exactly once "
                    f"(it holds it {names.count(required)} times)"
                )
        if names.index("documents") > names.index("question"):
            raise CisrankError(
                f"template {self.name!r}: '{{documents}}' must come before '{{question}}' "
                "(the gauge scores the question given the context before it)"
            )
        unknown = [n for n in names if n not in REQUIRED_FIELDS and n not in self.fields]
        if unknown:
            given = ", ".join(sorted(self.fields)) or "none"
            raise CisrankError(
                f"template {self.name!r} has an unknown field '{{{unknown[0]}}}': a template "
                f"may use {{documents}}, {{question}} and the fields given a value "
                f"(given: {given}); pass it as a field (--field {unknown[0]}=VALUE) or write "
                "literal braces as '{{' and '}}'"
            )
        for fmt in (self.document, self.single_document):
            if fmt is None:
                continue
            doc_names = field_names(fmt, f"document format of {self.name!r}")
            bad = [n for n in doc_names if n not in DOCUMENT_FIELDS]
            if bad:
                raise CisrankError(
                    f"document format {fmt!r} has an unknown field '{{{bad[0]}}}': "
                    f"it may use {', '.join('{' + f + '}' for f in DOCUMENT_FIELDS)}"
                )

    def single(self) -> ContextTemplate:
        """The template of a prompt with one passage (the per-document prompt of Entropy-Based
        Decoding, App. A.3)."""
        if self.single_document is None:
            return self
        return replace(self, document=self.single_document, single_document=None)

    def render_documents(self, passages: Sequence[Passage]) -> str:
        return self.separator.join(
            self.document.format(index=i, title=p.title, text=p.text, id=p.docid)
            for i, p in enumerate(passages, 1)
        )

    def render(self, question: str, passages: Sequence[Passage]) -> tuple[str, str, str]:
        """The prompt text cut at the question: (before, question, after), with a space just
        before the question moved into it."""
        text = self.text.format(
            **self.fields, documents=self.render_documents(passages), question=_SENTINEL
        )
        before, after = text.split(_SENTINEL)
        if before.endswith(" "):
            before, question = before[:-1], " " + question
        return before, question, after


_QA_INSTRUCTION = (
    "Write a high-quality answer for the given question using only the provided search results "
    "(some of which might be irrelevant)."
)
_NOISE_INSTRUCTION = (
    "You are given a question and you MUST respond by EXTRACTING the answer (max 5 tokens) from "
    "one of the provided documents. If none of the documents contain the answer, respond with "
    "NO-RES."
)

TEMPLATES: dict[str, ContextTemplate] = {
    # the gauge papers' App. D, Fig. 7, and the lost-in-the-middle code (nq-open prompt).
    "qa": ContextTemplate(
        "qa", _QA_INSTRUCTION + "\n\n{documents}\n\nQuestion: {question}\nAnswer:"
    ),
    # The Power of Noise, §4.4, and its code's `build_qa_prompt`.
    "noise": ContextTemplate(
        "noise", _NOISE_INSTRUCTION + "\nDocuments:\n{documents}\nQuestion: {question}\nAnswer:"
    ),
    # lost in the middle, kv_retrieval prompt: one JSON object of "key": "value" records.
    "kv": ContextTemplate(
        "kv",
        "Extract the value corresponding to the specified key in the JSON object below.\n\n"
        'JSON data:\n{{{documents}}}\n\nKey: "{question}"\nCorresponding value:',
        document='"{title}": "{text}"',
        separator=",\n ",
    ),
    # Entropy-Based Decoding, App. A.3, the naive prompt (its per-document prompt holds one).
    "entropy": ContextTemplate(
        "entropy",
        "Write a high-quality answer for the given question using only the provided search "
        "results.\n{documents}\nQuestion: {question}\nAnswer:",
        document="Document [{index}] (Title: {title}) {text}",
        single_document="Document (Title: {title}) {text}",
    ),
}


def resolve_template(
    template: str | ContextTemplate,
    fields: Mapping[str, str] | None = None,
    document: str | None = None,
) -> ContextTemplate:
    """A named template (qa, noise, kv, entropy), a custom string holding `{documents}` and
    `{question}`, or a `ContextTemplate`; `fields` fill its other named fields."""
    if isinstance(template, ContextTemplate):
        base = template
    elif template in TEMPLATES:
        base = TEMPLATES[template]
    elif "{documents}" in template and "{question}" in template:
        base = None
    else:
        raise CisrankError(
            f"template {template!r} is neither a named one ({', '.join(TEMPLATES)}) nor a string "
            "holding '{documents}' and '{question}'"
        )
    if base is None:
        assert isinstance(template, str)
        return ContextTemplate(
            "custom", template, document or DOCUMENT_FORMAT, "\n", dict(fields or {})
        )
    return ContextTemplate(
        base.name,
        base.text,
        document or base.document,
        base.separator,
        {**base.fields, **(fields or {})},
        None if document else base.single_document,
    )


def chat_wrap(tokenizer: Any, before: str, question: str, after: str) -> tuple[str, str, str]:
    """(before, question, after) inside the user's turn of the tokenizer's chat template, with
    the assistant's turn opened; a leading BOS text is dropped (the engine adds BOS itself)."""
    messages = [{"role": "user", "content": before + _SENTINEL + after}]
    text = chat_turns(
        tokenizer,
        messages,
        add_generation_prompt=True,
        bos_text=getattr(tokenizer, "bos_token", None),
        hint="; drop --chat",
    )
    if text.count(_SENTINEL) != 1:
        raise CisrankError("chat: the chat template did not render the user's message")
    head, tail = text.split(_SENTINEL)
    return head, question, tail
