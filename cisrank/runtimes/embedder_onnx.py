"""The ONNX Runtime runtime of bi-encoders (CPU, extra `onnx`): the model's whole
sentence-transformers module stack (the transformer, then its Pooling, Dense and Normalize
modules as `modules.json` declares them) exported once with `torch.onnx.export` into the
checksummed export cache the cross-encoder and the causal LM use (`cisrank.runtimes.onnx_export`:
keyed by the model folder's files, every file checked before each load, a damaged export made
again), so the pooling is the model's own, traced, not a copy of it.

Each export is verified before it is kept: its embeddings of texts other than the traced ones
(other lengths, padding) must match `SentenceTransformer.encode` on the same weights to 1e-5, or
the export is refused in one line (use the torch backend). BERT-family graphs are fused by ONNX
Runtime's transformer optimizer as the cross-encoder's are (`fuse_graph`), kept only where the
fused graph embeds as the unfused one.

Texts are read as sentence-transformers reads them: the tokenizer saved with the export,
truncated to the model's `max_seq_length` (or the one asked for), lower-cased where the model's
`do_lower_case` says; they are then batched as the cross-encoder's pairs are (sorted by token
length, padded by hand: `cisrank.runtimes.batching`). int8 quantizes the weight matrix products
dynamically (per-channel int8 weights, activations per tensor at run time, `quantize_dynamic_int8`),
attention products of two activations staying float32; its activation scale is taken over the
whole batch, so int8 embeds one text a batch on its own (`DYNAMIC_INT8_CPU_BATCH_SIZE`): a
passage's embedding is then a function of the passage, whatever shares its request. One text a
batch is too small a product for a second thread to share, so int8 runs a one-thread session on
`threads` lanes at once (`int8_lanes`): each embedding is the one-thread session's.

A model with a default prompt (`config_sentence_transformers.json`) is refused: the prompt's
tokens would have to be excluded from pooling as sentence-transformers does; the torch backend
embeds it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cisrank.errors import CisrankError, ModelNotFoundError, require
from cisrank.runtimes.batching import LengthBatcher
from cisrank.runtimes.embedder import normalized
from cisrank.runtimes.encoder import Pads, model_input_names
from cisrank.runtimes.encoder_onnx import fuse_graph
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
from cisrank.runtimes.table import FEATURE_EXTRACTION, check_compute_type

log = logging.getLogger(__name__)

ONNX_KIND = "bi-encoder"
"""The export folder's tag: a cross-encoder's or a causal LM's export is another graph."""
ONNX_MODEL = {"float32": "model.onnx", "int8": "model-int8.onnx"}
ONNX_TOKENIZER = "tokenizer"
OUTPUT = "sentence_embedding"
_FEATURE = "the bi-encoder's --backend onnx"

EXPORT_FORMAT = 1
"""Bumped when exports are made differently; an export of another format is made again."""

AGREEMENT = 1e-5
"""How far an export's embeddings may be from `SentenceTransformer.encode`'s (per component)."""

_TRACE_TEXTS = ["a passage", "a longer passage with more words in it"]
_CHECK_TEXTS = [
    "what is a query",
    "who",
    "a much longer passage with many more words in it than the others have",
    "",
]


def _export_onnx(source: Path, out: Path) -> dict[str, Any]:
    """The float32 module stack as `model.onnx` (input ids, attention mask and token types
    where the model has them -> the sentence embedding), with the tokenizer; returns the
    provenance (`cisrank.runtimes.onnx_export.cached_export`)."""
    require("onnx", "onnx", _FEATURE)
    import transformers
    from sentence_transformers import SentenceTransformer

    ort = import_onnxruntime(_FEATURE)
    try:
        st = SentenceTransformer(str(source), device="cpu", model_kwargs={"dtype": torch.float32})
    except OSError as exc:
        raise ModelNotFoundError(f"cannot load bi-encoder '{source}': {exc}") from exc
    st = st.eval().float()
    prompt = st.prompts.get(st.default_prompt_name, "") if st.default_prompt_name else ""
    if prompt:
        raise CisrankError(
            f"'{source}' embeds every text with its default prompt {prompt!r}, which the onnx "
            "backend does not reproduce: use backend 'torch'"
        )
    modules = list(st)
    first = modules[0]
    net: Any = getattr(first, "auto_model", None)
    if net is None or type(first).__name__ != "Transformer":
        raise CisrankError(
            f"'{source}' does not start with a sentence-transformers Transformer module "
            f"({type(first).__name__}): use backend 'torch'"
        )
    net.set_attn_implementation("eager")  # matmuls and softmax, which ORT's optimizer fuses
    tokenizer = st.tokenizer
    token_inputs = model_input_names(tokenizer)
    names = [*token_inputs, "attention_mask"]
    max_length = int(st.max_seq_length) if st.max_seq_length else None
    lower = bool(getattr(first, "do_lower_case", False))

    class Embedding(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net
            self.rest = torch.nn.ModuleList(modules[1:])

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            feeds = dict(zip(names, inputs, strict=True))
            hidden = self.net(**feeds, return_dict=True).last_hidden_state
            features: dict[str, Any] = {
                "token_embeddings": hidden,
                "attention_mask": feeds["attention_mask"],
            }
            for module in self.rest:
                features = module(features)
            return features[OUTPUT]

    def collate(texts: Sequence[str]) -> dict[str, np.ndarray]:
        enc = _tokenize(tokenizer, texts, max_length, lower, token_inputs)
        return Pads(tokenizer).collate(enc, list(range(len(texts))))

    trace = collate(_TRACE_TEXTS)
    raw = out / f"unfused-{ONNX_MODEL['float32']}"
    export_module(
        Embedding(),
        tuple(torch.from_numpy(trace[n]) for n in names),
        raw,
        input_names=names,
        output_names=[OUTPUT],
        dynamic_axes={**{n: {0: "batch", 1: "length"} for n in names}, OUTPUT: {0: "batch"}},
    )
    config = net.config
    check = collate(_CHECK_TEXTS)
    fused = fuse_graph(
        raw, out / ONNX_MODEL["float32"], config, check, output=OUTPUT, tolerance=AGREEMENT
    )
    session = ort.InferenceSession(
        str(out / ONNX_MODEL["float32"]), providers=["CPUExecutionProvider"]
    )
    inputs = {i.name for i in session.get_inputs()}
    got = normalized(session.run([OUTPUT], {k: v for k, v in check.items() if k in inputs})[0])
    with torch.inference_mode():
        want = st.encode(_CHECK_TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    gap = float(np.abs(got - want).max())
    if not gap <= AGREEMENT:
        raise CisrankError(
            f"the ONNX export of bi-encoder '{source}' embeds {gap:.2g} away from "
            "sentence-transformers' own (over 1e-5): use backend 'torch'"
        )
    tokenizer.save_pretrained(str(out / ONNX_TOKENIZER))
    return {
        "kind": ONNX_KIND,
        "format": EXPORT_FORMAT,
        "source": str(source),
        "architecture": (getattr(config, "architectures", None) or [type(net).__name__])[0],
        "modules": [type(m).__name__ for m in modules],
        "inputs": names,
        "max_length": max_length,
        "max_positions": getattr(config, "max_position_embeddings", None),
        "do_lower_case": lower,
        "dimensions": st.get_embedding_dimension(),
        "checked_gap": gap,
        "fused": fused,
        "opset": OPSET,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def _tokenize(
    tokenizer: Any,
    texts: Sequence[str],
    max_length: int | None,
    lower: bool,
    token_inputs: Sequence[str],
) -> dict[str, list[list[int]]]:
    """Token ids (and token types) of each text, unpadded, as sentence-transformers' Transformer
    module reads text (truncated to `max_length`, lower-cased where the model says)."""
    enc = tokenizer(
        [t.lower() for t in texts] if lower else list(texts),
        truncation=max_length is not None,
        max_length=max_length,
        padding=False,
        return_attention_mask=False,
    )
    return {name: enc[name] for name in token_inputs if name in enc}


def _quantize_onnx(folder: Path) -> None:
    """`model-int8.onnx`: every product with a weight matrix in dynamic int8 (a fused
    attention's query/key/value projection too); products of two activations stay float32."""
    quantize_dynamic_int8(
        folder / ONNX_MODEL["float32"],
        folder / ONNX_MODEL["int8"],
        op_types=["MatMul", "Attention"],
        const_weights_only=True,
    )


class OnnxEmbedder:
    """A bi-encoder's ONNX export run by ONNX Runtime on the CPU, as an `EmbedderBackend`.
    Exported on first use, quantized when int8 is first asked for."""

    name = "onnx"
    device = torch.device("cpu")

    def __init__(
        self, model: str, compute_type: str, threads: int, max_length: int | None = None
    ) -> None:
        ort = import_onnxruntime(_FEATURE)
        source = local_source(model, "bi-encoder")
        session_threads, self.lanes = int8_lanes(compute_type, threads)
        folder = open_export(
            source,
            _export_onnx,
            lambda f: self._open(ort, f, compute_type, session_threads),
            kind=ONNX_KIND,
            files=ONNX_MODEL,
            what=f"bi-encoder '{model}'",
        )
        self.folder = folder
        self.compute_type = compute_type
        positions = self.info.get("max_positions")
        if max_length is not None and positions and max_length > positions:
            raise CisrankError(
                f"max_seq_length {max_length} is over the {positions} positions of '{model}'"
            )
        self.max_length: int | None = max_length or self.info.get("max_length")
        self.dimensions: int | None = self.info.get("dimensions")
        self._lower = bool(self.info.get("do_lower_case"))
        self._token_inputs = model_input_names(self.tokenizer)
        self._pads = Pads(self.tokenizer)

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

    def embed(self, texts: Sequence[str], batch_size: int, normalize: bool = True) -> np.ndarray:
        """Texts tokenized, sorted by length and cut into batches of `batch_size`, each padded
        to its longest; the rows normalized in float32 unless `normalize` is False."""
        if not texts:
            return np.zeros((0, self.dimensions or 0), dtype=np.float32)
        enc = _tokenize(self.tokenizer, texts, self.max_length, self._lower, self._token_inputs)
        lengths = [len(ids) for ids in enc["input_ids"]]

        def run(rows: list[int]) -> list[np.ndarray]:
            batch = self._pads.collate(enc, rows)
            feeds = {k: v for k, v in batch.items() if k in self.inputs}
            (out,) = self.session.run([OUTPUT], feeds)
            return list(normalized(out) if normalize else np.asarray(out, np.float32))

        empty = np.zeros(self.dimensions or 0, dtype=np.float32)
        rows = LengthBatcher(batch_size=batch_size).run(lengths, run, empty, self.lanes)
        return np.stack(rows).astype(np.float32, copy=False)


def load(
    model: str,
    compute_type: str | None,
    *,
    device: str | None = None,
    threads: int | None = None,
    max_length: int | None = None,
    options: Mapping[str, Any] | None = None,
) -> OnnxEmbedder:
    """The table's loader (`cisrank.runtimes.table`): `model` exported once and run by ONNX
    Runtime on the CPU in `compute_type` (float32 when None), on `threads` (torch's when None)."""
    if device not in (None, "auto", "cpu"):
        raise CisrankError(f"the onnx backend runs on the CPU here, not on '{device}'")
    compute = {None: "float32", "auto": "float32", "fp32": "float32"}.get(
        compute_type, compute_type
    )
    check_compute_type("onnx", FEATURE_EXTRACTION, compute, flag="dtype")
    assert compute is not None
    threads = torch.get_num_threads() if threads is None else threads
    return OnnxEmbedder(model, compute, threads, max_length)
