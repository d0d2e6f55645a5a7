"""The ONNX Runtime runtime of cross-encoders (CPU, extra `onnx`): the whole
sequence-classification forward (input ids, attention mask and token types where the model has
them -> the logit) exported once with `torch.onnx.export` into a cache folder keyed by the model
folder's files (`cisrank.runtimes.onnx_export`, shared with the causal-LM onnx runtime), with the
tokenizer as the model folder loads it and the model's default truncation length, so a later
reranker loads the export alone; a damaged export, or one of an older format, is made again.
BERT-family graphs are fused by ONNX Runtime's transformer optimizer (one kernel each for
embeddings + LayerNorm, attention, bias + GELU, skip + LayerNorm), kept only where the fused
graph scores as the unfused one. The reranker's tokenization, truncation, dedupe, length
batching and raw-logit scores are those of the torch runtime; ONNX Runtime runs with torch's
thread count. float32 scores as torch float32 does (to float32 rounding, 1e-4 in tests); int8
quantizes the encoder's weight matrix products dynamically (per-channel int8 weights, 7-bit
activations: this CPU is AVX2 without VNNI), a fused attention's query/key/value projection
included, the pooler, classification head and attention products staying float32. Speed and
agreement on DL19 pairs: bench/cross_encoder.py, bench/RESULTS.md.

Why not sentence-transformers' own path (`CrossEncoder(..., backend="onnx")`): it needs
`optimum`, and every optimum / optimum-onnx release pins transformers < 4.58, while cisrank runs
transformers 5: installing it would downgrade transformers. The export here is what that path
does (a TorchScript ONNX export of the sequence-classification model and ONNX Runtime's dynamic
quantization), without optimum.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cisrank.errors import CisrankError, require
from cisrank.runtimes.encoder import Pads, default_max_length, model_input_names
from cisrank.runtimes.encoder_torch import load_cross_encoder
from cisrank.runtimes.onnx_export import (
    OPSET,
    export_module,
    import_onnxruntime,
    int8_lanes,
    local_source,
    open_export,
    open_session,
    quantize_dynamic_int8,
)
from cisrank.runtimes.table import SEQUENCE_CLASSIFICATION, check_compute_type

log = logging.getLogger(__name__)

ONNX_KIND = "cross-encoder"
"""The export folder's tag: a causal LM's export of the same folder is another graph."""
ONNX_MODEL = {"float32": "model.onnx", "int8": "model-int8.onnx"}
ONNX_TOKENIZER = "tokenizer"
_ONNX_FEATURE = "the cross-encoder's --backend onnx"

EXPORT_FORMAT = 2
"""Bumped when exports are made differently; an export of another format is made again.
2: eager attention, fused by ONNX Runtime's transformer optimizer where it matches."""

_FUSED_TYPES = {"bert": "bert", "roberta": "bert", "xlm-roberta": "bert", "electra": "bert"}
"""Encoder families whose graph ONNX Runtime's BERT fusions match (as optimum maps them);
others run unfused. A fused graph is kept only if it scores as the unfused one."""


def _export_onnx(source: Path, out: Path) -> dict[str, Any]:
    """The float32 sequence-classification forward as `model.onnx`, with the tokenizer the
    folder loads with; returns the provenance (`cisrank.runtimes.onnx_export.cached_export`).

    Exported with eager attention (the matrix products and softmax written out, which ONNX
    Runtime's transformer optimizer recognises; the SDPA export is one opaque pattern it does
    not), then fused (`fuse_graph`): embeddings + LayerNorm, attention, bias + GELU and skip +
    LayerNorm each become one kernel. On the MiniLM-L6 student over DL19 pairs that made int8
    1.22x faster on 2 threads (bench/RESULTS.md)."""
    require("onnx", "onnx", _ONNX_FEATURE)
    import transformers

    encoder = load_cross_encoder(str(source), torch.device("cpu"))
    net = encoder.model.eval().float()
    net.set_attn_implementation("eager")
    tokenizer = encoder.tokenizer
    token_inputs = model_input_names(tokenizer)
    names = [*token_inputs, "attention_mask"]

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return self.net(**dict(zip(names, inputs, strict=True))).logits

    # traced on two real pairs of different lengths, so the padding mask is traced as a mask
    enc = tokenizer(
        ["a query", "a query"],
        ["a passage", "a longer passage with more words in it"],
        padding=False,
        return_attention_mask=False,
    )
    batch = Pads(tokenizer).collate({n: enc[n] for n in token_inputs}, [0, 1])
    raw = out / f"unfused-{ONNX_MODEL['float32']}"
    export_module(
        Logits(),
        tuple(torch.from_numpy(batch[n]) for n in names),
        raw,
        input_names=names,
        output_names=["logits"],
        dynamic_axes={
            **{n: {0: "batch", 1: "length"} for n in names},
            "logits": {0: "batch"},
        },
    )
    config = net.config
    # checked on other pairs than the traced ones: more of them, other lengths and padding
    check = tokenizer(
        ["what is a query", "who", "what is a query"],
        ["a passage", "a much longer passage with many more words in it than the others", "x"],
        padding=False,
        return_attention_mask=False,
    )
    fused = fuse_graph(
        raw,
        out / ONNX_MODEL["float32"],
        config,
        Pads(tokenizer).collate({n: check[n] for n in token_inputs}, [0, 1, 2]),
    )
    tokenizer.save_pretrained(str(out / ONNX_TOKENIZER))
    return {
        "kind": ONNX_KIND,
        "format": EXPORT_FORMAT,
        "source": str(source),
        "architecture": (getattr(config, "architectures", None) or [type(net).__name__])[0],
        "inputs": names,
        "max_length": default_max_length(tokenizer, config),
        "max_positions": getattr(config, "max_position_embeddings", None),
        "fused": fused,
        "opset": OPSET,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def fuse_graph(
    raw: Path,
    dst: Path,
    config: Any,
    batch: dict[str, np.ndarray],
    *,
    output: str = "logits",
    tolerance: float = 1e-4,
) -> dict[str, Any]:
    """`dst`: `raw` fused by ONNX Runtime's transformer optimizer, kept only where its `output`
    on `batch` agrees with the unfused graph's to `tolerance`; else `raw` itself. Returns what
    was fused (operator counts) or why not. Shared with the bi-encoder's export
    (`cisrank.runtimes.embedder_onnx`), whose output is the sentence embedding."""
    family = _FUSED_TYPES.get(getattr(config, "model_type", ""))
    heads, hidden = getattr(config, "num_attention_heads", 0), getattr(config, "hidden_size", 0)
    if family is None or not heads or not hidden:
        raw.replace(dst)
        return {"ops": {}, "reason": f"no fusion for model type {config.model_type!r}"}
    ort = import_onnxruntime(_ONNX_FEATURE)
    from onnxruntime.transformers.optimizer import optimize_model

    fused = optimize_model(str(raw), model_type=family, num_heads=heads, hidden_size=hidden)
    ops = {k: v for k, v in fused.get_fused_operator_statistics().items() if v}
    fused.save_model_to_file(str(dst))

    def logits(path: Path) -> np.ndarray:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        inputs = {i.name for i in session.get_inputs()}
        return session.run([output], {k: v for k, v in batch.items() if k in inputs})[0]

    gap = float(np.abs(logits(dst) - logits(raw)).max())
    if not gap <= tolerance:
        log.warning("the fused ONNX graph scores %.2g away from the unfused one: unfused kept", gap)
        raw.replace(dst)
        return {"ops": {}, "reason": f"fused graph off by {gap:.2g}"}
    raw.unlink()
    return {"ops": ops}


def _quantize_onnx(folder: Path) -> None:
    """`model-int8.onnx`: the encoder's weight matrix products in dynamic int8 (per-channel,
    reduced range), a fused attention's query/key/value projection too (`QAttention`); the
    pooler and classification head and the attention products of two activations stay
    float32, as in `quantize_int8`."""
    import onnx

    src = folder / ONNX_MODEL["float32"]
    graph = onnx.load(str(src), load_external_data=False).graph
    head = [n.name for n in graph.node if "pooler" in n.name or "classifier" in n.name]
    # the quantizer turns a Gemm into a MatMul named after it, then quantizes that
    head += [f"{name}_MatMul" for name in head]
    quantize_dynamic_int8(
        src,
        folder / ONNX_MODEL["int8"],
        op_types=["MatMul", "Attention"],
        nodes_to_exclude=head,
        const_weights_only=True,
    )


class OnnxCrossEncoder:
    """A cross-encoder's ONNX export run by ONNX Runtime on the CPU: its session, tokenizer and
    recorded facts (`info`), as an `EncoderBackend`. Exported on first use, quantized when int8
    is first asked for."""

    name = "onnx"
    device = torch.device("cpu")
    dtype = torch.float32
    """Around the int8 products too."""

    def __init__(self, model: str, compute_type: str, threads: int) -> None:
        ort = import_onnxruntime(_ONNX_FEATURE)
        source = local_source(model, "cross-encoder")
        session_threads, self.lanes = int8_lanes(compute_type, threads)
        folder = open_export(
            source,
            _export_onnx,
            lambda f: self._open(ort, f, compute_type, session_threads),
            kind=ONNX_KIND,
            files=ONNX_MODEL,
            what=f"cross-encoder '{model}'",
        )
        self.folder = folder
        self.compute_type = compute_type
        self.max_length = int(self.info["max_length"])
        self.max_positions: int | None = self.info.get("max_positions")

    def _open(self, ort: Any, folder: Path, compute_type: str, threads: int) -> None:
        from transformers import AutoTokenizer

        self.info, self.session = open_session(
            ort,
            folder,
            compute_type,
            threads,
            kind=ONNX_KIND,
            export_format=EXPORT_FORMAT,
            files=ONNX_MODEL,
            quantize=_quantize_onnx,
        )
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder / ONNX_TOKENIZER))
        self.inputs = {i.name for i in self.session.get_inputs()}

    def logits(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """The first logit of each row of a collated batch."""
        feeds = {k: v for k, v in batch.items() if k in self.inputs}
        (out,) = self.session.run(["logits"], feeds)
        return out[:, 0]


def load(
    model: str,
    compute_type: str | None,
    *,
    device: str | None = None,
    threads: int | None = None,
    max_length: int | None = None,
    options: Mapping[str, Any] | None = None,
) -> OnnxCrossEncoder:
    """The table's loader (`cisrank.runtimes.table`): `model` exported once and run by ONNX
    Runtime on the CPU in `compute_type` (float32 when None), on `threads` (torch's when None).
    torch's `quantize` option has no place here (its int8 is `compute_type="int8"`)."""
    if device not in (None, "auto", "cpu"):
        raise CisrankError(f"the onnx backend runs on the CPU here, not on '{device}'")
    quantize = (options or {}).get("quantize", "none")
    if quantize != "none":
        raise CisrankError(
            f"quantize={quantize!r} is the torch backend's dynamic int8: with backend='onnx' "
            "use dtype='int8'"
        )
    compute = {None: "float32", "auto": "float32", "fp32": "float32"}.get(
        compute_type, compute_type
    )
    check_compute_type("onnx", SEQUENCE_CLASSIFICATION, compute, flag="dtype")
    assert compute is not None
    return OnnxCrossEncoder(model, compute, torch.get_num_threads() if threads is None else threads)
