"""The ONNX Runtime runtime of causal LMs: a causal LM's transformer body exported once to ONNX,
run by ONNX Runtime in float32 or dynamic int8, with the LM head applied by the engine's rules.

Why it exists: ONNX Runtime is the ecosystem's portable CPU path (sentence-transformers serves
its cross-encoders through it), and its int8 kernels are the other quantized candidate beside
CTranslate2. It is an optional extra (`pip install 'cisrank[onnx]'`), never a default unless
measured to pay (`bench/lm_backends.py`, bench/RESULTS.md).

What is exported: the base model only (tokens -> final hidden states, with explicit attention
mask and position ids, so padding never enters a row), not the LM head: the engine applies the
head only at the positions it scores, in chunks, with a float32 log-softmax, exactly as the torch
backend does, so full `[batch, length, vocab]` logits are never built.

int8: dynamic quantization of the body's matrix multiplications, per output channel, with the
reduced range that AVX2 hosts without VNNI need (their u8 x s8 instruction saturates at full
range), and the MLP's down projection kept in float32: small LMs carry activation outliers
there, and quantizing it reordered passages (Spearman to float32 about 0.5 on DL19 pairs, 0.95
without it; measured when this backend was written).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cisrank.errors import CisrankError
from cisrank.runtimes.batching import pad_batch
from cisrank.runtimes.lm import (
    ConvertedBackend,
    Reference,
    converted_options,
    local_source,
    need_reference,
)
from cisrank.runtimes.onnx_export import (
    cached_export,
    discard,
    export_module,
    identity,
    import_onnxruntime,
    make_derived,
    quantize_dynamic_int8,
    record,
)
from cisrank.runtimes.table import CAUSAL_LM, compute_types

log = logging.getLogger(__name__)

BODY = {"float32": "body.onnx", "int8": "body-int8.onnx"}
HEAD = "head.npy"


def _export(source: Path, out: Path, reference: Callable[[Path], Reference]) -> dict[str, Any]:
    """The body as ONNX and the LM head's weight as a float32 array; returns what to record."""
    import torch

    engine = reference(source)
    backend = engine.torch_backend()
    body = backend.base

    class Body(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = body

        def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any) -> Any:
            return self.body(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=False,
            ).last_hidden_state

    ids = torch.ones((2, 8), dtype=torch.long)
    axes = {"input_ids", "attention_mask", "position_ids", "hidden"}
    # checked against the torch model on other shapes and padding (tests/lm/test_backends.py)
    export_module(
        Body(),
        (ids, torch.ones_like(ids), torch.arange(8).unsqueeze(0).expand(2, -1)),
        out / BODY["float32"],
        input_names=["input_ids", "attention_mask", "position_ids"],
        output_names=["hidden"],
        dynamic_axes={name: {0: "batch", 1: "length"} for name in axes},
    )
    head = backend.lm_head.weight.detach().to(torch.float32).numpy()
    np.save(out / HEAD, head)
    cfg = backend.model.config
    return {
        "source": str(source),
        "source_fingerprint": engine.fingerprint(),
        "max_positions": backend.max_positions,
        "num_layers": backend.num_layers,
        "logit_scale": getattr(cfg, "logit_scale", None),
        "final_logit_softcapping": getattr(cfg, "final_logit_softcapping", None),
    }


def _quantize(folder: Path) -> None:
    """`body-int8.onnx` from `body.onnx` (see the module docstring for the choices)."""
    import onnx

    graph = onnx.load(str(folder / BODY["float32"]), load_external_data=False).graph
    keep = [n.name for n in graph.node if n.op_type == "MatMul" and "down_proj" in n.name]
    quantize_dynamic_int8(folder / BODY["float32"], folder / BODY["int8"], nodes_to_exclude=keep)


def exported_folder(
    source: str | Path,
    reference: Callable[[Path], Reference],
    compute_type: str = "float32",
    cache: str | Path | None = None,
) -> Path:
    """The ONNX export of the Hugging Face folder `source` (made once from its torch `reference`,
    kept under `cache`, default `<user cache>/cisrank/onnx`: `cisrank.runtimes.onnx_export`),
    with its int8 body when asked; every file checked against the export's record first, a
    damaged one made again."""
    final = cached_export(
        Path(source),
        lambda src, out: _export(src, out, reference),
        required=(BODY["float32"], HEAD),
        derived=(BODY["int8"],),
        cache=cache,
    )
    if compute_type == "int8":
        make_derived(final, BODY["int8"], lambda: _quantize(final))
    return final


class OnnxBackend(ConvertedBackend):
    """An exported model (`exported_folder`) as an `LMBackend`, scoring only."""

    name = "onnx"
    compute_types = compute_types(name, CAUSAL_LM)
    owner = "the onnx backend's"

    def __init__(
        self,
        folder: str | Path,
        *,
        compute_type: str = "float32",
        threads: int = 0,
        head_chunk_rows: int = 1024,
        model_name: str = "",
    ) -> None:
        super().__init__(folder, compute_type, model_name)
        ort = import_onnxruntime()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(self.folder / BODY[compute_type]), options, providers=["CPUExecutionProvider"]
        )
        info = record(self.folder)
        self._provenance = identity(self.folder)
        self.max_positions: int | None = info["max_positions"]
        self.num_layers = int(info["num_layers"])
        self._logit_scale = info.get("logit_scale")
        self._softcap = info.get("final_logit_softcapping")
        import torch

        self._head = torch.from_numpy(np.load(self.folder / HEAD))
        self.head_chunk_rows = head_chunk_rows

    def identity(self) -> list[bytes]:
        """The source model's torch fingerprint (the engine adds the runtime and compute type)."""
        return [self._provenance]

    def score_rows(
        self,
        rows: Sequence[Sequence[int]],
        context: Sequence[int],
        pad_id: int,
        cached: Any = None,
    ) -> np.ndarray:
        import torch

        self._no_prefix(cached)
        ids, mask, _ = pad_batch(rows, pad_id)
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        (hidden,) = self.session.run(
            None, {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
        )
        width = ids.shape[1]
        src: list[int] = []
        tgt: list[int] = []
        for r, (row, ctx) in enumerate(zip(rows, context, strict=True)):
            if ctx < 1:
                raise CisrankError("a scored span must follow at least one token (BOS)")
            src.extend(r * width + j - 1 for j in range(ctx, len(row)))
            tgt.extend(row[ctx:])
        flat = torch.from_numpy(hidden.reshape(-1, hidden.shape[-1]))
        out = np.empty(len(src), dtype=np.float32)
        step = self.head_chunk_rows
        with torch.inference_mode():
            for start in range(0, len(src), step):
                rows_h = flat[torch.tensor(src[start : start + step])]
                logits = rows_h @ self._head.T
                if self._logit_scale is not None:
                    logits = logits * float(self._logit_scale)
                if self._softcap is not None:
                    logits = torch.tanh(logits / self._softcap) * self._softcap
                picked = logits.gather(1, torch.tensor(tgt[start : start + step]).unsqueeze(1))
                out[start : start + step] = (
                    picked.squeeze(1) - torch.logsumexp(logits, dim=-1)
                ).numpy()
        return out


def load(
    model: str,
    compute_type: str | None,
    *,
    device: str | None = None,
    threads: int | None = None,
    reference: Callable[[Path], Reference] | None = None,
    options: dict[str, Any] | None = None,
    cache: str | Path | None = None,
) -> tuple[OnnxBackend, Any]:
    """The table's loader (`cisrank.runtimes.table`): (backend, tokenizer) for a model name or
    folder, exported once from its torch `reference`, loaded in `compute_type` (float32 when
    None) on `threads` (torch's when None)."""
    from transformers import AutoTokenizer

    compute, threads = converted_options("onnx", device, compute_type, threads)
    make = need_reference(reference, "onnx")
    import_onnxruntime()  # before an export that ONNX Runtime could not run
    source = local_source(model, "onnx")
    for attempt in (1, 2):
        folder = exported_folder(source, make, compute, cache)
        try:
            backend = OnnxBackend(folder, compute_type=compute, threads=threads, model_name=model)
            break
        except CisrankError:
            raise
        except Exception as exc:  # an intact export that ONNX Runtime cannot load
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if attempt == 2:
                raise CisrankError(
                    f"cannot load the ONNX export of '{model}' ({folder}): {first}"
                ) from exc
            log.warning("the ONNX export %s does not load (%s): making it again", folder, first)
            discard(folder)
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    return backend, tokenizer
