"""`cisrank generate`: answer a question over passages with entropy-based decoding (seed 004).

    cisrank generate --query "who wrote hamlet" --passages top5.jsonl --decoding clehe \\
        --model HuggingFaceTB/SmolLM2-135M-Instruct

prints `{query, model, template, decoding, answer, tokens, attribution, weights, layers}`:
`attribution` is, per generated token, the id of the passage of lowest entropy (null for naive),
`weights` the passage weights w_{j,t} of each step and `layers` CLeHe's chosen layer l*.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from cisrank.cli.context import (
    ChatOpt,
    DocumentOpt,
    FieldOpt,
    PassagesOpt,
    QueryOpt,
    TopKOpt,
    load_inputs,
)
from cisrank.cli.options import DeviceOpt, ModelOpt
from cisrank.errors import CisrankError


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
    model: ModelOpt = None,
    decoding: Annotated[
        str,
        typer.Option(
            "--decoding",
            help="naive (all passages in one prompt), avg_ens, replug (weights from the "
            "passages' 'score'), leens or clehe.",
        ),
    ] = "naive",
    arrange: Annotated[
        str,
        typer.Option(
            "--arrange", help="naive: the passages' order in the prompt (as `cisrank context`)."
        ),
    ] = "ranked",
    template: Annotated[
        str,
        typer.Option(
            "--template",
            help="entropy (seed 004's prompts), qa, noise, kv, or a custom string holding "
            "{documents} and {question}.",
        ),
    ] = "entropy",
    field: FieldOpt = None,
    document: DocumentOpt = None,
    chat: ChatOpt = False,
    top_k: TopKOpt = None,
    tau: Annotated[float, typer.Option("--tau", help="LeEns/CLeHe entropy temperature.")] = 0.25,
    beta: Annotated[float, typer.Option("--beta", help="CLeHe contrast strength.")] = 0.25,
    layers: Annotated[
        str | None,
        typer.Option(
            "--layers",
            help="CLeHe candidate layers, e.g. 16,18,20 (default: even layers of the last half).",
        ),
    ] = None,
    replug_temperature: Annotated[
        float, typer.Option("--replug-temperature", help="replug: T of softmax(score / T).")
    ] = 1.0,
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", min=1, help="Most tokens to generate.")
    ] = 32,
    device: DeviceOpt = None,
) -> None:
    """Answer a question over passages, greedy, with naive or entropy-based decoding (JSON)."""
    from cisrank.context import ARRANGEMENTS, ContextAssembler
    from cisrank.context.decoding import DECODINGS, EnsembleDecoder

    if decoding not in DECODINGS:
        raise CisrankError(f"--decoding {decoding!r}: use one of {', '.join(DECODINGS)}")
    if arrange not in ARRANGEMENTS:
        raise CisrankError(f"--arrange {arrange!r}: use one of {', '.join(ARRANGEMENTS)}")
    layer_list = _parse_layers(layers)
    docs, scores, fields = load_inputs(query, passages, template, field, document, top_k, model)
    if decoding == "replug" and scores is None:
        raise CisrankError("--decoding replug needs a 'score' on every line of --passages")
    assembler = ContextAssembler(
        model,  # type: ignore[arg-type]  # load_inputs raised if None
        template,
        fields=fields,
        document=document,
        chat=chat,
        device=device,
    )
    decoder = EnsembleDecoder(
        assembler, tau=tau, beta=beta, layers=layer_list, replug_temperature=replug_temperature
    )
    order = list(range(len(docs)))
    if decoding == "naive" and arrange != "ranked":
        order = assembler.order(query, docs, arrange).order
    ordered = [docs[i] for i in order]
    ordered_scores = [scores[i] for i in order] if scores is not None else None
    result = decoder.generate(
        query, ordered, decoding, max_new_tokens=max_new_tokens, scores=ordered_scores
    )
    out = {
        "query": query,
        "model": assembler.engine.model_name,
        "template": assembler.template.name,
        "order": order,
        **result.to_json(ordered),
    }
    typer.echo(json.dumps(out, indent=2))
