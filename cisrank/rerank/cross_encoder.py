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
taken per batch, so an int8 score can also move slightly with the pairs it is batched with.
`dtype="float32"` matches `CrossEncoder.predict(..., activation_fn=Identity())` to float32
rounding.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from cisrank.devices import resolve_device, resolve_dtype
from cisrank.errors import CisrankError, ModelNotFoundError
from cisrank.lm.batching import LengthBatcher, dedupe, pad_batch, scatter
from cisrank.models.resolve import resolve_model
from cisrank.rerank.base import BaseReranker, fast_only
from cisrank.rerank.configs import CPU_BATCH_SIZE, GPU_BATCH_SIZE, CrossEncoderRerankerConfig

_UNSET_MAX_LENGTH = 1_000_000  # tokenizers without a limit report ~1e30


def _cpu_probe(name: str) -> bool:
    """A `torch.cpu._is_*_supported` probe (private API: absent or failing reads as False)."""
    probe = getattr(torch.cpu, name, None)
    try:
        return bool(probe()) if probe is not None else False
    except Exception:  # pragma: no cover - defensive
        return False


def cpu_has_native_bf16() -> bool:
    """bf16 matmuls in hardware (AVX512-BF16 or AMX): there bf16 is ~3x faster than float32."""
    return _cpu_probe("_is_avx512_bf16_supported") or _cpu_probe("_is_amx_tile_supported")


def _cpu_has_vnni() -> bool:
    """int8 dot products that accumulate in int32 (AVX512-VNNI / AVX-VNNI): no saturation."""
    return _cpu_probe("_is_vnni_supported")


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
        if _cpu_has_vnni():

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
        encoder = CrossEncoder(
            path, device=str(device), max_length=max_length, activation_fn=torch.nn.Identity()
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


class CrossEncoderReranker(BaseReranker):
    """Scores (query, passage) pairs with a CrossEncoder's raw logit.

    Example:
        r = CrossEncoderReranker(model="out/student", quantize="int8")
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
                "the cross-encoder reranker needs a model: pass --model with the folder written "
                "by distillation training (any sentence-transformers CrossEncoder folder works)"
            )
        self.model_name = self.config.model
        self.device = resolve_device(self.config.device)
        on_gpu = self.device.type == "cuda"
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

        self.encoder = load_cross_encoder(self.config.model, self.device, self.config.max_length)
        self.tokenizer = self.encoder.tokenizer
        net = self.encoder.model.eval()
        if self.dtype != torch.float32:
            net = net.to(dtype=self.dtype)
            keep_head_float32(net)
        if self.config.quantize == "int8":
            net = quantize_int8(net)
        self.model = net
        self.max_length = self.config.max_length or self._model_max_length()
        positions = getattr(net.config, "max_position_embeddings", None)
        if self.config.max_length and positions and self.config.max_length > positions:
            raise CisrankError(
                f"max_length {self.config.max_length} is over the {positions} positions of "
                f"'{self.config.model}'"
            )
        self.batch_size = self.config.batch_size or (GPU_BATCH_SIZE if on_gpu else CPU_BATCH_SIZE)
        self._input_names = [
            n for n in self.tokenizer.model_input_names if n in ("input_ids", "token_type_ids")
        ]
        self._pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self._pad_type_id = getattr(self.tokenizer, "pad_token_type_id", 0) or 0
        self._pad_left = getattr(self.tokenizer, "padding_side", "right") == "left"
        # Capabilities: the tokenizer the pairs are read with, and their truncation length.
        self.fast_tokenizer = fast_only(self.tokenizer)
        self.pair_token_limit = self.max_length

    def _resolve_dtype(self) -> torch.dtype:
        if self.config.dtype not in (None, "auto"):
            return resolve_dtype(self.config.dtype, self.device)
        if self.device.type == "cpu":
            native = self.config.quantize == "none" and cpu_has_native_bf16()
            return torch.bfloat16 if native else torch.float32
        return resolve_dtype(None, self.device)

    def _model_max_length(self) -> int:
        """The tokenizer's limit, as `predict` uses; the position table's where it has none."""
        limit = self.tokenizer.model_max_length
        if limit is None or limit > _UNSET_MAX_LENGTH:
            limit = getattr(self.model.config, "max_position_embeddings", None) or 512
        return int(limit)

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
        left = self._pad_left
        ids, mask, _ = pad_batch([enc["input_ids"][i] for i in rows], self._pad_id, left=left)
        out = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in enc:
            types = [enc["token_type_ids"][i] for i in rows]
            out["token_type_ids"] = pad_batch(types, self._pad_type_id, left=left)[0]
        return {k: torch.from_numpy(v).to(self.device) for k, v in out.items()}

    def _score_unique(self, pairs: list[tuple[str, str]]) -> list[float]:
        enc = self.tokenize(pairs)

        def score(rows: list[int]) -> list[float]:
            logits = self.model(**self._collate(enc, rows)).logits
            return logits[:, 0].float().cpu().numpy().tolist()

        with torch.inference_mode():
            lengths = [len(ids) for ids in enc["input_ids"]]
            return LengthBatcher(batch_size=self.batch_size).run(lengths, score, 0.0)

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
        return (
            f"CrossEncoderReranker(model={self.model_name!r}, device={str(self.device)!r}, "
            f"dtype={str(self.dtype).removeprefix('torch.')!r}, quantize={self.config.quantize!r})"
        )
