"""`cisrank generate`: answer a question over passages with entropy-based decoding ("Entropy-Based
Decoding for Retrieval-Augmented Large Language Models").

    cisrank generate --query "who wrote hamlet" --passages top5.jsonl --decoding clehe \\
        --model HuggingFaceTB/SmolLM2-135M-Instruct

prints `{query, model, template, order, decoding, answer, tokens, attribution, weights, layers}`:
`order` indexes the input passages in prompt order (naive decoding with --arrange), `attribution`
is, per generated token, the id of the passage of lowest entropy (null for naive), `weights` the
passage weights w_{j,t} of each step and `layers` CLeHe's chosen layer l*.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cisrank.cli.context import (
    ChatOpt,
    DocumentOpt,
    FieldOpt,
    PassagesOpt,
    QueryOpt,
    TopKOpt,
    arrangement,
    echo_json,
    load_inputs,
)
from cisrank.cli.defaults import config_flag, field_help
from cisrank.cli.options import DeviceOpt, LanguageModelOpt
from cisrank.context.config import (
    ArrangeConfig,
    DecoderConfig,
    Decoding,
    GenerationAssemblerConfig,
)
from cisrank.errors import CisrankError

if TYPE_CHECKING:
    from cisrank.context import Answer, ContextAssembler


def _parse_layers(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CisrankError(f"--layers {text!r}: expected comma-separated layer numbers") from None


def generate(
    query: QueryOpt,
    passages: PassagesOpt,
    model: LanguageModelOpt,
    decoding: Annotated[
        str | None,
        typer.Option(
            "--decoding",
            help=field_help(
                DecoderConfig,
                "decoding",
                "naive (all passages in one prompt), avg_ens, replug (weights from the "
                "passages' 'score'), leens or clehe.",
            ),
        ),
    ] = None,
    arrange: Annotated[
        str | None,
        typer.Option(
            "--arrange",
            help=field_help(
                ArrangeConfig,
                "arrange",
                "naive: the passages' order in the prompt (as `cisrank context`).",
            ),
        ),
    ] = None,
    template: Annotated[
        str | None, config_flag(GenerationAssemblerConfig, "template", "--template")
    ] = None,
    field: FieldOpt = None,
    document: DocumentOpt = None,
    chat: ChatOpt = None,
    top_k: TopKOpt = None,
    tau: Annotated[float | None, config_flag(DecoderConfig, "tau", "--tau")] = None,
    beta: Annotated[float | None, config_flag(DecoderConfig, "beta", "--beta")] = None,
    layers: Annotated[
        str | None,
        typer.Option(
            "--layers",
            help="CLeHe candidate layers, e.g. 16,18,20 (default: even layers of the last half).",
        ),
    ] = None,
    replug_temperature: Annotated[
        float | None, config_flag(DecoderConfig, "replug_temperature", "--replug-temperature")
    ] = None,
    max_new_tokens: Annotated[
        int | None, config_flag(DecoderConfig, "max_new_tokens", "--max-new-tokens", min=1)
    ] = None,
    device: DeviceOpt = None,
) -> None:
    """Answer a question over passages, greedy, with naive or entropy-based decoding (JSON)."""
    from cisrank.context import ContextAssembler, EnsembleDecoder, answer_question

    mode = None if decoding is None else Decoding.parse(decoding, "--decoding")
    order = arrangement(arrange)
    layer_list = _parse_layers(layers)
    docs, scores, prompt = load_inputs(
        query,
        passages,
        top_k,
        GenerationAssemblerConfig(),
        template=template,
        field=field,
        document=document,
        chat=chat,
    )
    settings = _decoder_settings(mode, max_new_tokens, scores)
    assembler = ContextAssembler(model, config=prompt, device=device)
    decoder = EnsembleDecoder(
        assembler,
        settings,
        tau=tau,
        beta=beta,
        layers=layer_list,
        replug_temperature=replug_temperature,
    )
    _echo_answer(query, assembler, answer_question(decoder, query, docs, order, scores=scores))


def _decoder_settings(
    mode: Decoding | None, max_new_tokens: int | None, scores: list[float] | None
) -> DecoderConfig:
    """The decoding flags over `DecoderConfig`'s defaults, checked before the model loads:
    replug weighs the passages by their scores, so the passages must carry them."""
    settings = DecoderConfig().replace(decoding=mode, max_new_tokens=max_new_tokens)
    if settings.decoding is Decoding.REPLUG and scores is None:
        raise CisrankError("--decoding replug needs a 'score' on every line of --passages")
    return settings


def _echo_answer(query: str, assembler: ContextAssembler, answer: Answer) -> None:
    """Print the answer (JSON); an empty one also says why on stderr (an instruct model out of
    its chat template ends its turn at once), since an empty answer looks like a bug."""
    why = answer.generation.why_empty(assembler.engine.tokenizer, assembler.chat)
    if why is not None:
        typer.echo(f"warning: the answer is empty: {why}", err=True)
    echo_json(query, assembler, answer.to_json())
