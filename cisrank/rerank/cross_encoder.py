"""Cross-encoder reranker: one transformer reads query and passage together and emits one logit.

Loads any sentence-transformers `CrossEncoder` folder with a single-logit sequence-classification
head (`num_labels=1`), such as the students written by our distillation training, and returns the
RAW logit: identity activation, no sigmoid, because the student regresses CIS / teacher scores.

Speed, on top of what `CrossEncoder.predict` already does (length sorting, inference mode):

- `score_batch` tokenizes every distinct (query, passage) pair of all requests in one call, so
  concurrent requests share model batches and a pair asked for twice is scored once;
- batches are cut from the pairs sorted by token length and padded by hand to their longest
  member (`cisrank.lm.batching`, shared with the CIS engine); CPU batches are small (less
  padding), GPU batches large;
- arithmetic: bf16 on GPUs (fp16 where bf16 is missing), and on CPUs with native bf16 matmuls
  (AVX512-BF16 or AMX), with the pooler and head kept in float32 so that scores are not rounded
  to bf16; float32 on other CPUs. `quantize="int8"` (CPU, opt-in) instead runs the encoder's
  Linear layers as dynamic int8 (per-channel weights, activations quantized per batch at run
  time); the classification head and pooler stay float32.

Agreement with float32 on real DL19 passages (MiniLM-L6 encoder, untrained head, see
bench/cross_encoder.py): bf16 scores correlate 0.9999 (Pearson, per query); int8 only 0.97-0.98
per query, 0.98-0.99 over all pairs, which is why int8 is opt-in. int8 activation scales are
taken per batch, so on a CPU int8 scores one pair a batch (`CPU_BATCH_SIZE`): a pair's score
then never moves with the pairs beside it (a `batch_size` set by hand gives that up).
`dtype="float32"` matches `CrossEncoder.predict(..., activation_fn=Identity())` to float32
rounding.

`backend="onnx"` (CPU, extra `onnx`) runs the same model through ONNX Runtime: the whole
sequence-classification forward (input ids, attention mask and token types where the model has
them -> the logit) is exported once with `torch.onnx.export` into a cache folder keyed by the
model folder's files (`cisrank.lm.onnx_export`, shared with the causal-LM onnx backend), with
the tokenizer as the model folder loads it and the model's default truncation length, so a
later reranker loads the export alone; a damaged export, or one of an older format, is made
again. BERT-family graphs are fused by ONNX Runtime's transformer optimizer (one kernel each
for embeddings + LayerNorm, attention, bias + GELU, skip + LayerNorm), kept only where the
fused graph scores as the unfused one. Tokenization,
truncation, dedupe, length batching and raw-logit scores are those of the torch path; ONNX
Runtime runs with torch's thread count. `dtype="float32"` scores as torch float32 does (to
float32 rounding, 1e-4 in tests); `dtype="int8"` quantizes the encoder's weight matrix products
dynamically (per-channel int8 weights, 7-bit activations: this CPU is AVX2 without VNNI),
a fused attention's query/key/value projection included, the pooler, classification head and
attention products staying float32. Speed and agreement on DL19
pairs: bench/cross_encoder.py, bench/RESULTS.md.

Why not sentence-transformers' own path (`CrossEncoder(..., backend="onnx")`): it needs
`optimum`, and every optimum / optimum-onnx release pins transformers < 4.58, while cisrank runs
transformers 5: installing it would downgrade transformers. The export here is what that path
does (a TorchScript ONNX export of the sequence-classification model and ONNX Runtime's dynamic
quantization), without optimum.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cisrank import env
from cisrank.devices import cpu_has_native_bf16, cpu_has_vnni, resolve_device, resolve_dtype
from cisrank.errors import CisrankError, ModelNotFoundError, require
from cisrank.lm.backends import onnx_int8_fits
from cisrank.lm.batching import LengthBatcher, dedupe, pad_batch, scatter
from cisrank.lm.onnx_export import (
    OPSET,
    PROVENANCE,
    cached_export,
    discard,
    export_module,
    import_onnxruntime,
    make_derived,
    quantize_dynamic_int8,
)
from cisrank.models.resolve import resolve_model
from cisrank.rerank.base import BaseReranker, fast_only
from cisrank.rerank.configs import (
    CPU_BATCH_SIZE,
    GPU_BATCH_SIZE,
    CrossEncoderRerankerConfig,
    StudentRerankerConfig,
)

log = logging.getLogger(__name__)

_UNSET_MAX_LENGTH = 1_000_000  # tokenizers without a limit report ~1e30

ONNX_KIND = "cross-encoder"
"""The export folder's tag: a causal LM's export of the same folder is another graph."""
ONNX_MODEL = {"float32": "model.onnx", "int8": "model-int8.onnx"}
ONNX_TOKENIZER = "tokenizer"
ONNX_COMPUTE_TYPES = ("float32", "int8")
_ONNX_FEATURE = "the cross-encoder's --backend onnx"


def _linear_names(model: torch.nn.Module, head: bool) -> list[str]:
    """Linear layers of the encoder body (head=False), or of the pooler and classification head
    (head=True): everything outside `base_model_prefix`, and the pooler inside it."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    names = []
    for name, module in model.named_modules():
        if type(module) is not torch.nn.Linear:
            continue
        in_head = (bool(prefix) and not name.startswith(prefix + ".")) or "pooler" in name
        if in_head == head:
            names.append(name)
    return names


def _as_float32(module: torch.nn.Module, args: tuple) -> tuple:
    return tuple(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args)


def keep_head_float32(model: torch.nn.Module) -> None:
    """Run the pooler and classification head in float32 on a bf16/fp16 body, in place.

    The score is read off the head: computed in bf16 it would be rounded to 8 significant bits
    (steps of 1/32 at a logit of 5), tying passages the body still tells apart.
    """
    for name in _linear_names(model, head=True):
        module = model.get_submodule(name)
        module.float()
        module.register_forward_pre_hook(_as_float32)


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Dynamic int8 quantization of the backbone's Linear layers, in place.

    Weights are quantized per output channel; activations per tensor at run time, on the full
    8-bit range where the CPU has VNNI (without it, fbgemm's u8 x s8 multiply-adds can saturate,
    so the 7-bit range it defaults to is kept). The pooler and the classification head stay
    float32: they are tiny, and the score is read straight off them.
    """
    with warnings.catch_warnings():
        # torch.ao.quantization announces its move to torchao; it still works in torch 2.13.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        try:
            from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
            from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
        except ImportError as exc:  # pragma: no cover - future torch without torch.ao.quantization
            raise CisrankError(
                f"quantize='int8' needs torch.ao.quantization.quantize_dynamic, which torch "
                f"{torch.__version__} does not have: use quantize='none'"
            ) from exc
        if "fbgemm" not in torch.backends.quantized.supported_engines and (
            "x86" not in torch.backends.quantized.supported_engines
        ):
            raise CisrankError(
                "quantize='int8' needs an x86 CPU with fbgemm "
                f"(this torch has {torch.backends.quantized.supported_engines}): use quantize='none'"
            )
        linear_cls = DynamicLinear
        if cpu_has_vnni():

            class FullRangeDynamicLinear(DynamicLinear):
                def forward(self, x: torch.Tensor) -> torch.Tensor:
                    y = torch.ops.quantized.linear_dynamic(
                        x, self._packed_params._packed_params, reduce_range=False
                    )
                    return y.to(x.dtype)

            linear_cls = FullRangeDynamicLinear
        names = _linear_names(model, head=False)
        if not names:
            raise CisrankError(f"quantize='int8': no Linear layers found in {type(model).__name__}")
        return quantize_dynamic(
            model,
            dict.fromkeys(names, per_channel_dynamic_qconfig),
            mapping={torch.nn.Linear: linear_cls},
            inplace=True,
        )


def load_cross_encoder(model: str, device: torch.device, max_length: int | None = None):
    """A sentence-transformers CrossEncoder with a one-logit classification head, checked."""
    from sentence_transformers import CrossEncoder
    from sentence_transformers.base.modules import Transformer

    path = resolve_model(model)
    try:
        # float32 by name: transformers 5 loads in the checkpoint's own type by default, and the
        # shipped student is stored as float16 (widened here; bf16 is made from float32 later).
        encoder = CrossEncoder(
            path,
            device=str(device),
            max_length=max_length,
            activation_fn=torch.nn.Identity(),
            model_kwargs={"dtype": torch.float32},
        )
    except OSError as exc:
        raise ModelNotFoundError(f"cannot load cross-encoder '{model}' from {path}: {exc}") from exc
    modules = list(encoder)
    if (
        len(modules) != 1
        or not isinstance(modules[0], Transformer)
        or modules[0].transformer_task != "sequence-classification"
    ):
        raise CisrankError(
            f"'{model}' is not a plain sequence-classification cross-encoder (modules: "
            f"{', '.join(type(m).__name__ for m in modules)}); only those are supported"
        )
    config = encoder.model.config
    archs = getattr(config, "architectures", None) or []
    if archs and not any(a.endswith("ForSequenceClassification") for a in archs):
        raise CisrankError(
            f"'{model}' holds a {archs[0]}, not a cross-encoder: loading it would put a random "
            "classification head on top. Pass the folder written by cross-encoder training"
        )
    if encoder.num_labels != 1:
        raise CisrankError(
            f"'{model}' has {encoder.num_labels} labels; the cross-encoder reranker needs a "
            "single-logit model (num_labels=1)"
        )
    return encoder


def default_max_length(tokenizer: Any, config: Any) -> int:
    """The tokenizer's limit, as `predict` uses; the position table's where it has none."""
    limit = tokenizer.model_max_length
    if limit is None or limit > _UNSET_MAX_LENGTH:
        limit = getattr(config, "max_position_embeddings", None) or 512
    return int(limit)


def model_input_names(tokenizer: Any) -> list[str]:
    """The token-level inputs the model is given besides the attention mask."""
    return [n for n in tokenizer.model_input_names if n in ("input_ids", "token_type_ids")]


class _Pads:
    """How a tokenizer pads: token and token-type fillers, and the side."""

    def __init__(self, tokenizer: Any) -> None:
        self.token = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.token_type = getattr(tokenizer, "pad_token_type_id", 0) or 0
        self.left = getattr(tokenizer, "padding_side", "right") == "left"

    def collate(self, enc: dict[str, list[list[int]]], rows: list[int]) -> dict[str, np.ndarray]:
        """The rows of `enc`, padded to their longest, with the attention mask (int64)."""
        ids, mask, _ = pad_batch([enc["input_ids"][i] for i in rows], self.token, left=self.left)
        out = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in enc:
            types = [enc["token_type_ids"][i] for i in rows]
            out["token_type_ids"] = pad_batch(types, self.token_type, left=self.left)[0]
        return out


# ---------------------------------------------------------------------- the ONNX Runtime backend
EXPORT_FORMAT = 2
"""Bumped when exports are made differently; an export of another format is made again.
2: eager attention, fused by ONNX Runtime's transformer optimizer where it matches."""

_FUSED_TYPES = {"bert": "bert", "roberta": "bert", "xlm-roberta": "bert", "electra": "bert"}
"""Encoder families whose graph ONNX Runtime's BERT fusions match (as optimum maps them);
others run unfused. A fused graph is kept only if it scores as the unfused one."""


def _export_onnx(source: Path, out: Path) -> dict[str, Any]:
    """The float32 sequence-classification forward as `model.onnx`, with the tokenizer the
    folder loads with; returns the provenance (`cisrank.lm.onnx_export.cached_export`).

    Exported with eager attention (the matrix products and softmax written out, which ONNX
    Runtime's transformer optimizer recognises; the SDPA export is one opaque pattern it does
    not), then fused (`_fuse`): embeddings + LayerNorm, attention, bias + GELU and skip +
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
    batch = _Pads(tokenizer).collate({n: enc[n] for n in token_inputs}, [0, 1])
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
    fused = _fuse(
        raw,
        out / ONNX_MODEL["float32"],
        config,
        _Pads(tokenizer).collate({n: check[n] for n in token_inputs}, [0, 1, 2]),
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


def _fuse(raw: Path, dst: Path, config: Any, batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """`dst`: `raw` fused by ONNX Runtime's transformer optimizer, kept only where its logits on
    `batch` agree with the unfused graph's to 1e-4; else `raw` itself. Returns what was fused
    (operator counts) or why not."""
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
        return session.run(["logits"], {k: v for k, v in batch.items() if k in inputs})[0]

    gap = float(np.abs(logits(dst) - logits(raw)).max())
    if not gap <= 1e-4:
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class OnnxCrossEncoder:
    """A cross-encoder's ONNX export run by ONNX Runtime on the CPU: its session, tokenizer and
    recorded facts (`info`). Exported on first use, quantized when int8 is first asked for."""

    def __init__(self, model: str, compute_type: str, threads: int) -> None:
        ort = import_onnxruntime(_ONNX_FEATURE)
        path = resolve_model(model)
        source = Path(path)
        if not source.is_dir():
            raise ModelNotFoundError(
                f"cannot load cross-encoder '{model}': --backend onnx exports a local model "
                f"folder, and '{path}' is none (pull it first: cisrank models pull)"
            )
        for attempt in (1, 2):
            folder = cached_export(
                source,
                _export_onnx,
                kind=ONNX_KIND,
                required=(ONNX_MODEL["float32"],),
                derived=(ONNX_MODEL["int8"],),
            )
            try:
                self._open(ort, folder, compute_type, threads)
                break
            except Exception as exc:
                if attempt == 2:
                    raise CisrankError(
                        f"cannot load the ONNX export of cross-encoder '{model}' ({folder}): "
                        f"{_first_line(exc)}"
                    ) from exc
                log.warning(
                    "the ONNX export %s does not load (%s): making it again",
                    folder,
                    _first_line(exc),
                )
                discard(folder)
        self.folder = folder
        self.compute_type = compute_type

    def _open(self, ort: Any, folder: Path, compute_type: str, threads: int) -> None:
        from transformers import AutoTokenizer

        self.info = json.loads((folder / PROVENANCE).read_text())
        if self.info.get("kind") != ONNX_KIND:
            raise CisrankError(f"{folder} holds no cross-encoder export")
        if self.info.get("format") != EXPORT_FORMAT:
            raise CisrankError(
                f"{folder} is an export of format {self.info.get('format', 1)}, not "
                f"{EXPORT_FORMAT} (an older cisrank made it)"
            )
        if compute_type == "int8":  # made once, recorded and checked with the export

            def quantize() -> None:
                log.info("quantizing %s to int8 (once)", folder)
                _quantize_onnx(folder)

            make_derived(folder, ONNX_MODEL["int8"], quantize)
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder / ONNX_TOKENIZER))
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(folder / ONNX_MODEL[compute_type]), options, providers=["CPUExecutionProvider"]
        )
        self.inputs = {i.name for i in self.session.get_inputs()}

    def logits(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """The first logit of each row of a collated batch."""
        feeds = {k: v for k, v in batch.items() if k in self.inputs}
        (out,) = self.session.run(["logits"], feeds)
        return out[:, 0]


def _resolve_backend(config: CrossEncoderRerankerConfig) -> tuple[str, str | None]:
    """The (backend, dtype) that `backend="auto"` (the default) means: what
    `$CISRANK_ENCODER_BACKEND` names where set; else ONNX Runtime int8 on a CPU where onnxruntime
    is installed and neither a dtype nor torch's quantization is asked for (the student's fast
    path: bench/RESULTS.md, 2.29x torch float32 and 1.22x torch bf16 for the kept student on an
    AVX-512 VNNI host, 1.7x-2.4x float32 on AVX2); torch otherwise (a GPU, no onnxruntime).
    Other backends are taken as asked."""
    if config.backend != "auto":
        return config.backend, config.dtype
    forced = env.encoder_backend()
    if forced is not None:
        if forced not in ("torch", "onnx"):
            raise CisrankError(
                f"{env.ENCODER_BACKEND}={forced!r} is not a cross-encoder backend: torch or onnx"
            )
        if forced == "torch":
            return "torch", config.dtype
        return "onnx", config.dtype or "int8"
    if config.quantize == "none" and onnx_int8_fits(config.device, config.dtype):
        return "onnx", "int8"
    return "torch", config.dtype


class CrossEncoderReranker(BaseReranker):
    """Scores (query, passage) pairs with a CrossEncoder's raw logit.

    Example:
        r = CrossEncoderReranker(model="out/student", quantize="int8")
        r = CrossEncoderReranker(model="out/student", backend="onnx", dtype="int8")
        r.score("When was the author of Hamlet born?", passages)
    """

    name = "cross-encoder"

    def __init__(
        self,
        model: str | None = None,
        *,
        config: CrossEncoderRerankerConfig | None = None,
        **options: Any,
    ) -> None:
        """`options` are `CrossEncoderRerankerConfig` fields."""
        self.config = (config or CrossEncoderRerankerConfig()).replace(model=model, **options)
        if not self.config.model:
            raise CisrankError(
                "the cross-encoder reranker needs a model: pass --model with a CrossEncoder "
                "folder (the one distillation training writes) or leave it unset for the "
                "student shipped with cisrank (cisrank-student)"
            )
        self.model_name = self.config.model
        self.backend, dtype = _resolve_backend(self.config)
        self.config = self.config.replace(backend=self.backend, dtype=dtype)
        self.onnx: OnnxCrossEncoder | None = None
        self.model: torch.nn.Module | None = None
        if self.backend == "onnx":
            self._init_onnx()
        else:
            self._init_torch()
        on_gpu = self.device.type == "cuda"
        dynamic_int8 = self.config.quantize == "int8" or (
            self.onnx is not None and self.compute_type == "int8"
        )
        runtime = "int8" if dynamic_int8 else "onnx" if self.onnx is not None else "torch"
        cpu_batch = CPU_BATCH_SIZE[runtime]
        self.batch_size = self.config.batch_size or (GPU_BATCH_SIZE if on_gpu else cpu_batch)
        self._input_names = model_input_names(self.tokenizer)
        self._pads = _Pads(self.tokenizer)
        # Capabilities: the tokenizer the pairs are read with, and their truncation length.
        self.fast_tokenizer = fast_only(self.tokenizer)
        self.pair_token_limit = self.max_length

    def _init_torch(self) -> None:
        self.device = resolve_device(self.config.device)
        if self.config.dtype == "int8":
            raise CisrankError(
                "dtype='int8' is the onnx backend's compute type: with the torch backend use "
                "quantize='int8' (or backend='onnx')"
            )
        if self.config.quantize == "int8":
            if self.device.type != "cpu":
                raise CisrankError(
                    f"quantize='int8' runs on CPU only (device is {self.device}); "
                    "GPUs already run bf16/fp16"
                )
            if self.config.dtype not in (None, "auto", "float32", "fp32"):
                raise CisrankError(
                    f"quantize='int8' computes in float32 around the int8 matmuls; "
                    f"drop dtype={self.config.dtype!r}"
                )
        self.dtype = self._resolve_dtype()
        self.compute_type = str(self.dtype).removeprefix("torch.")
        if self.config.quantize == "int8":
            self.compute_type = "int8"

        self.encoder = load_cross_encoder(self.model_name, self.device, self.config.max_length)
        self.tokenizer = self.encoder.tokenizer
        net = self.encoder.model.eval()
        if self.dtype != torch.float32:
            net = net.to(dtype=self.dtype)
            keep_head_float32(net)
        if self.config.quantize == "int8":
            net = quantize_int8(net)
        self.model = net
        self.max_length = self.config.max_length or default_max_length(self.tokenizer, net.config)
        self._check_max_length(getattr(net.config, "max_position_embeddings", None))

    def _init_onnx(self) -> None:
        if self.config.device not in (None, "auto", "cpu"):
            raise CisrankError(
                f"the onnx backend runs on the CPU here, not on '{self.config.device}'"
            )
        if self.config.quantize != "none":
            raise CisrankError(
                f"quantize={self.config.quantize!r} is the torch backend's dynamic int8: with "
                "backend='onnx' use dtype='int8'"
            )
        compute = {None: "float32", "auto": "float32", "fp32": "float32"}.get(
            self.config.dtype, self.config.dtype
        )
        if compute not in ONNX_COMPUTE_TYPES:
            raise CisrankError(
                f"dtype {self.config.dtype!r} is not a compute type of the onnx backend: one of "
                f"{', '.join(ONNX_COMPUTE_TYPES)}"
            )
        self.device = torch.device("cpu")
        self.dtype = torch.float32  # around the int8 products too
        self.compute_type = str(compute)
        self.onnx = OnnxCrossEncoder(self.model_name, self.compute_type, self.threads)
        self.tokenizer = self.onnx.tokenizer
        self.max_length = self.config.max_length or int(self.onnx.info["max_length"])
        self._check_max_length(self.onnx.info.get("max_positions"))

    @property
    def threads(self) -> int:
        """ONNX Runtime's intra-op threads: torch's (`--threads-per-worker` sets them)."""
        return torch.get_num_threads()

    def _check_max_length(self, positions: int | None) -> None:
        if self.config.max_length and positions and self.config.max_length > positions:
            raise CisrankError(
                f"max_length {self.config.max_length} is over the {positions} positions of "
                f"'{self.config.model}'"
            )

    def _resolve_dtype(self) -> torch.dtype:
        if self.config.dtype not in (None, "auto"):
            return resolve_dtype(self.config.dtype, self.device)
        if self.device.type == "cpu":
            native = self.config.quantize == "none" and cpu_has_native_bf16()
            return torch.bfloat16 if native else torch.float32
        return resolve_dtype(None, self.device)

    # ------------------------------------------------------------------ pieces
    def tokenize(self, pairs: Sequence[tuple[str, str]]) -> dict[str, list[list[int]]]:
        """Token ids (and token types) of each pair, unpadded, truncated longest-first."""
        enc = self.tokenizer(
            [q for q, _ in pairs],
            [p for _, p in pairs],
            truncation="longest_first",
            max_length=self.max_length,
            padding=False,
            return_attention_mask=False,
        )
        return {name: enc[name] for name in self._input_names if name in enc}

    def _collate(self, enc: dict[str, list[list[int]]], rows: list[int]) -> dict[str, torch.Tensor]:
        batch = self._pads.collate(enc, rows)
        return {k: torch.from_numpy(v).to(self.device) for k, v in batch.items()}

    def _score_unique(self, pairs: list[tuple[str, str]]) -> list[float]:
        enc = self.tokenize(pairs)
        lengths = [len(ids) for ids in enc["input_ids"]]
        batcher = LengthBatcher(batch_size=self.batch_size)
        onnx = self.onnx
        if onnx is not None:

            def run_onnx(rows: list[int]) -> list[float]:
                return onnx.logits(self._pads.collate(enc, rows)).tolist()

            return batcher.run(lengths, run_onnx, 0.0)
        model = self.model
        assert model is not None

        def run_torch(rows: list[int]) -> list[float]:
            logits = model(**self._collate(enc, rows)).logits
            return logits[:, 0].float().cpu().numpy().tolist()

        with torch.inference_mode():
            return batcher.run(lengths, run_torch, 0.0)

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """Raw logit of each (query, passage) pair, input order; duplicates scored once."""
        if not pairs:
            return []
        unique, slots = dedupe(pairs)
        return scatter(self._score_unique(unique), slots)

    # ------------------------------------------------------------------ public API
    def score_batch(self, requests: Sequence[tuple[str, Sequence[str]]]) -> list[list[float]]:
        """All pairs of all requests in shared, length-sorted batches; results per request."""
        for _, passages in requests:
            if isinstance(passages, str):
                raise CisrankError("passages must be a list of strings, not one string")
        flat = [(q, p) for q, passages in requests for p in passages]
        scores = self.score_pairs(flat)
        out, start = [], 0
        for _, passages in requests:
            out.append(scores[start : start + len(passages)])
            start += len(passages)
        return out

    def __repr__(self) -> str:
        cls = type(self).__name__
        if self.onnx is not None:
            return f"{cls}(model={self.model_name!r}, backend='onnx', dtype={self.compute_type!r})"
        return (
            f"{cls}(model={self.model_name!r}, device={str(self.device)!r}, "
            f"dtype={str(self.dtype).removeprefix('torch.')!r}, quantize={self.config.quantize!r})"
        )


class StudentReranker(CrossEncoderReranker):
    """The student that ships with cisrank (`cisrank-student`, `cisrank.models.shipped`): a
    MiniLM-L6 cross-encoder distilled from CIS and all-mpnet-base-v2 (`make student`), served
    as `--reranker student`. The same scores as `--reranker cross-encoder --model
    cisrank-student`, option for option; only its name and its config's label differ.

    Example:
        load_reranker("student").rank("who wrote hamlet", documents, top_n=3)
    """

    name = "student"

    def __init__(
        self,
        model: str | None = None,
        *,
        config: CrossEncoderRerankerConfig | None = None,
        **options: Any,
    ) -> None:
        super().__init__(model, config=config or StudentRerankerConfig(), **options)
