"""One-time ONNX exports of local model folders, kept in a cache keyed by the folder's files.

Shared by the causal-LM backend (`cisrank.lm.onnx_backend`) and the cross-encoder reranker
(`cisrank.rerank.cross_encoder`), which export different graphs of their models the same way:

- `torch.onnx.export` with the TorchScript exporter (`dynamo=False`), opset 17, batch and
  length axes dynamic, the tracer's warnings silenced (each export is checked against its torch
  model on other shapes and padding by its tests);
- the export written into a temporary folder beside its final place and renamed into it, so a
  reader never sees half an export and two processes exporting at once both end with one; the
  final folder is `<cache>/<folder name>[-<kind>]-<key>`, the key hashing the source folder's
  resolved path and its files' names, sizes and modification times, so editing or replacing
  the model makes a new export (the cache defaults to `<user cache>/cisrank/onnx`);
- an export missing its provenance record or one of its files is removed and made again;
  a file that is present but does not load is for the caller to report (`discard` it and
  export again, as the cross-encoder does);
- int8 by `onnxruntime.quantization.quantize_dynamic`: weights per output channel, activations
  per tensor at run time, on the reduced 7-bit range, because this project's CPU is AVX2
  without VNNI, whose u8 x s8 multiply-add saturates at full range.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from cisrank import env
from cisrank.errors import MissingExtraError
from cisrank.lm.backend import folder_key

log = logging.getLogger(__name__)

OPSET = 17
PROVENANCE = "cisrank-onnx.json"
"""The record written last into every export: what was exported, from where, by what."""


def import_onnxruntime(feature: str = "--backend onnx") -> Any:
    """`onnxruntime`, or the one-line error naming the extra that installs it."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise MissingExtraError("onnxruntime", "onnx", feature) from exc
    return onnxruntime


def cache_root(cache: str | Path | None = None) -> Path:
    return Path(cache) if cache is not None else env.user_cache_dir() / "cisrank" / "onnx"


def export_path(source: Path, kind: str = "", cache: str | Path | None = None) -> Path:
    """Where the export of `source` lives (whether made yet or not)."""
    tag = f"-{kind}" if kind else ""
    return cache_root(cache) / f"{source.name}{tag}-{folder_key(source)}"


def is_complete(folder: Path, required: Collection[str] = ()) -> bool:
    return (folder / PROVENANCE).is_file() and all((folder / f).is_file() for f in required)


def discard(folder: Path) -> None:
    """Remove an export (a damaged one, to make it again); processes that have it open keep
    reading their files."""
    shutil.rmtree(folder, ignore_errors=True)


def cached_export(
    source: Path,
    export: Callable[[Path, Path], Mapping[str, Any]],
    *,
    kind: str = "",
    required: Collection[str] = (),
    cache: str | Path | None = None,
) -> Path:
    """The export folder of `source`, made once by `export(source, out)` (which writes its files
    into `out` and returns the provenance to record) unless complete already."""
    final = export_path(source, kind, cache)
    if is_complete(final, required):
        return final
    if final.exists():
        log.warning("the ONNX export %s is incomplete: making it again", final)
        discard(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=final.parent))
    try:
        out = work / "model"
        out.mkdir()
        log.info("exporting %s to ONNX (once) into %s", source, final)
        info = export(source, out)
        (out / PROVENANCE).write_text(json.dumps(dict(info), indent=2))
        try:
            os.replace(out, final)
        except OSError:  # another process exported it first
            if not is_complete(final, required):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def export_module(
    module: Any,
    args: tuple,
    path: Path,
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_axes: Mapping[str, Mapping[int, str]],
) -> None:
    """`torch.onnx.export` of `module` (in eval mode) traced on `args`, as described above."""
    import torch

    with torch.inference_mode(), warnings.catch_warnings():
        # the tracer warns about every shape-dependent branch of the mask code; each export is
        # checked against its torch model on other shapes and padding by its tests
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(),
            args,
            str(path),
            input_names=list(input_names),
            output_names=list(output_names),
            dynamic_axes={k: dict(v) for k, v in dynamic_axes.items()},
            opset_version=OPSET,
            dynamo=False,
        )


class _OnnxRuntimeAdvice(logging.Filter):
    """Drops the records onnxruntime's quantizer logs below ERROR (other code's pass)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or "onnxruntime" not in record.pathname


def quantize_dynamic_int8(
    src: Path,
    dst: Path,
    *,
    op_types: Sequence[str] | None = None,
    nodes_to_exclude: Sequence[str] = (),
    const_weights_only: bool = False,
) -> None:
    """`dst`: `src` with dynamic int8 matrix multiplications (see the module docstring), written
    beside `dst` and renamed into place. `op_types`: the node types quantized (onnxruntime's
    default set when None); `const_weights_only`: only products with a weight matrix, never
    two activations (attention scores stay float32)."""
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # a name of this process's own (written with the usual permissions), renamed into place
    tmp = str(dst.parent / f".{dst.name}.{os.getpid()}.partial")
    root = logging.getLogger()
    advice = _OnnxRuntimeAdvice()
    try:
        # quantize_dynamic logs advice (pre-processing, ...) on the root logger
        root.addFilter(advice)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_dynamic(
                str(src),
                tmp,
                op_types_to_quantize=list(op_types) if op_types is not None else None,
                per_channel=True,
                reduce_range=True,
                weight_type=QuantType.QInt8,
                nodes_to_exclude=list(nodes_to_exclude),
                # contrib ops of a fused graph (SkipLayerNormalization, ...) have no shape
                # inference: their outputs are float32
                extra_options={
                    "DefaultTensorType": TensorProto.FLOAT,
                    **({"MatMulConstBOnly": True} if const_weights_only else {}),
                },
            )
        os.replace(tmp, dst)
    finally:
        root.removeFilter(advice)
        if os.path.exists(tmp):
            os.unlink(tmp)
