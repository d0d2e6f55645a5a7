"""The torch runtime of cross-encoders: a sentence-transformers `CrossEncoder` folder with a
single-logit sequence-classification head, run by torch, returning the RAW logit (identity
activation, no sigmoid: the student regresses CIS / teacher scores).

Arithmetic: bf16 on GPUs (fp16 where bf16 is missing), with the pooler and head kept in float32
so that scores are not rounded to bf16; float32 on CPUs, even with native bf16 matmuls, where
bf16 (asked for by name) made a pair's logit move with its batch company and thread count
beyond what DL21's rankings tolerate (bench/bf16_invariance.py). `quantize="int8"` (CPU, opt-in) instead runs the encoder's
Linear layers as dynamic int8 (per-channel weights, activations quantized per batch at run
time); the classification head and pooler stay float32.

Agreement with float32 on real DL19 passages (MiniLM-L6 encoder, untrained head, see
bench/cross_encoder.py): bf16 scores correlate 0.9999 (Pearson, per query); int8 only 0.97-0.98
per query, 0.98-0.99 over all pairs, which is why int8 is opt-in. int8 activation scales are
taken per batch, so on a CPU int8 scores one pair a batch (`CPU_BATCH_SIZE`): a pair's score
then never moves with the pairs beside it (a `batch_size` set by hand gives that up).
`dtype="float32"` matches `CrossEncoder.predict(..., activation_fn=Identity())` to float32
rounding.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from cisrank.devices import cpu_has_vnni, resolve_device, resolve_dtype
from cisrank.errors import CisrankError, ModelNotFoundError
from cisrank.models.integrity import damaged_folder_error
from cisrank.models.resolve import resolve_model
from cisrank.runtimes.encoder import default_max_length


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
    path = resolve_model(model)  # before the import of seconds: a bad name fails at once
    from sentence_transformers import CrossEncoder
    from sentence_transformers.base.modules import Transformer

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
    except Exception as exc:
        damaged = damaged_folder_error("cross-encoder", model, path)
        if damaged is not None:
            raise damaged from None
        if isinstance(exc, OSError):
            raise ModelNotFoundError(
                f"cannot load cross-encoder '{model}' from {path}: {exc}"
            ) from exc
        raise
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


class TorchEncoder:
    """A loaded cross-encoder's network as an `EncoderBackend`: the batch moved to its device,
    run under inference mode, the first logit read in float32."""

    name = "torch"
    lanes = None  # torch batches on its own intra-op threads

    def __init__(
        self,
        net: torch.nn.Module,
        tokenizer: Any,
        *,
        device: torch.device,
        dtype: torch.dtype,
        compute_type: str,
    ) -> None:
        self.net = net
        self.tokenizer = tokenizer
        self.device = device
        self.dtype = dtype
        """The body's float type (float32 around a quantized body's int8 products)."""
        self.compute_type = compute_type
        self.max_length = default_max_length(tokenizer, net.config)
        self.max_positions: int | None = getattr(net.config, "max_position_embeddings", None)

    def logits(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        feeds = {k: torch.from_numpy(v).to(self.device) for k, v in batch.items()}
        with torch.inference_mode():
            return self.net(**feeds).logits[:, 0].float().cpu().numpy()


def _resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype not in (None, "auto"):
        return resolve_dtype(dtype, device)
    if device.type == "cpu":
        # float32 even with native bf16: there a pair's bf16 logit moved with its batch company
        # by 0.014 and with the thread count by 0.008, where DL21's top-10 neighbours are 0.011
        # apart at the 5th percentile (bench/bf16_invariance.py); bf16 is asked for by name
        return torch.float32
    return resolve_dtype(None, device)


def load(
    model: str,
    compute_type: str | None,
    *,
    device: str | None = None,
    threads: int | None = None,
    max_length: int | None = None,
    options: Mapping[str, Any] | None = None,
) -> TorchEncoder:
    """The table's loader (`cisrank.runtimes.table`): `model` on `device` (CUDA when present)
    in `compute_type` (None: as the module docstring says), `options["quantize"]` "int8" for
    torch's dynamic int8 on a CPU. Threads are torch's own."""
    quantize = (options or {}).get("quantize", "none")
    dev = resolve_device(device)
    if compute_type == "int8":
        raise CisrankError(
            "dtype='int8' is the onnx backend's compute type: with the torch backend use "
            "quantize='int8' (or backend='onnx')"
        )
    if quantize == "int8":
        if dev.type != "cpu":
            raise CisrankError(
                f"quantize='int8' runs on CPU only (device is {dev}); GPUs already run bf16/fp16"
            )
        if compute_type not in (None, "auto", "float32", "fp32"):
            raise CisrankError(
                f"quantize='int8' computes in float32 around the int8 matmuls; "
                f"drop dtype={compute_type!r}"
            )
    dtype = _resolve_dtype(compute_type, dev)
    encoder = load_cross_encoder(model, dev, max_length)
    net = encoder.model.eval()
    if dtype != torch.float32:
        net = net.to(dtype=dtype)
        keep_head_float32(net)
    if quantize == "int8":
        net = quantize_int8(net)
    computes = "int8" if quantize == "int8" else str(dtype).removeprefix("torch.")
    return TorchEncoder(net, encoder.tokenizer, device=dev, dtype=dtype, compute_type=computes)
