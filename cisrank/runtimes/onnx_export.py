"""One-time ONNX exports of local model folders, kept in a cache keyed by the folder's files.

Shared by the ONNX Runtime runtimes of causal LMs (`cisrank.runtimes.lm_onnx`) and of
cross-encoders (`cisrank.runtimes.encoder_onnx`), which export different graphs of their models
the same way:

- `torch.onnx.export` with the TorchScript exporter (`dynamo=False`), opset 17, batch and
  length axes dynamic, the tracer's warnings silenced (each export is checked against its torch
  model on other shapes and padding by its tests);
- the export written into a temporary folder beside its final place and renamed into it, so a
  reader never sees half an export and two processes exporting at once both end with one; the
  final folder is `<cache>/<folder name>[-<kind>]-<key>`, the key hashing the source folder's
  resolved path and its files' names, sizes and modification times, so editing or replacing
  the model makes a new export (the cache defaults to `<user cache>/cisrank/onnx`);
- every file of an export is checksummed in its record and checked before every load, like a
  pulled model (`cisrank.runtimes.checked_cache`): an export with a missing, changed or added
  file, or a record without checksums (an older cisrank's) is removed and made again, one
  warning naming the file; the int8 graph quantized later is added to the record the same way
  (`make_derived`); an intact export that still does not load is for the caller to report
  (`discard` it and export again, as the cross-encoder does);
- int8 by `onnxruntime.quantization.quantize_dynamic`: weights per output channel, activations
  per tensor at run time, on the reduced 7-bit range, because this project's CPU is AVX2
  without VNNI, whose u8 x s8 multiply-add saturates at full range.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cisrank import env
from cisrank.errors import CisrankError, MissingExtraError, ModelNotFoundError, require
from cisrank.models.resolve import resolve_model
from cisrank.runtimes import checked_cache
from cisrank.runtimes.lm import folder_key

log = logging.getLogger(__name__)

OPSET = 17
PROVENANCE = "cisrank-onnx.json"
"""The record written last into every export: what was exported, from where, by what, and the
size and sha256 of every file (`cisrank.runtimes.checked_cache`)."""
EXPORTING = "exporting a model to ONNX (--backend onnx)"


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
    derived: Collection[str] = (),
    cache: str | Path | None = None,
) -> Path:
    """The export folder of `source`, made once by `export(source, out)` (which writes its files
    into `out` and returns the provenance to record) unless intact already: every file checked
    against the record (a `stat` each while unchanged), a damaged export made again. `derived`:
    the files made from it later (`make_derived`), checked (and made again) when used."""
    final = export_path(source, kind, cache)

    def convert(out: Path) -> Mapping[str, Any]:
        log.info("exporting %s to ONNX (once) into %s", source, final)
        return export(source, out)

    checked_cache.cached_conversion(
        final, PROVENANCE, convert, required=required, derived=derived, what="ONNX export"
    )
    return final


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def local_source(model: str, what: str) -> Path:
    """The local folder `--backend onnx` exports for `model` (a name resolved, a pull checked);
    a hub id with no folder here is refused in one line naming `what` the model is."""
    path = resolve_model(model)
    source = Path(path)
    if not source.is_dir():
        raise ModelNotFoundError(
            f"cannot load {what} '{model}': --backend onnx exports a local model "
            f"folder, and '{path}' is none (pull it first: cisrank models pull)"
        )
    return source


def open_export(
    source: Path,
    export: Callable[[Path, Path], Mapping[str, Any]],
    open_: Callable[[Path], None],
    *,
    kind: str,
    files: Mapping[str, str],
    what: str,
) -> Path:
    """The export folder of `source` (`cached_export`, its `files` by compute type: float32's
    required, the others derived), opened by `open_`. An intact export that still does not open
    is discarded and made once more; a second failure is one line naming `what` and the folder."""
    required = tuple(v for k, v in files.items() if k == "float32")
    derived = tuple(v for k, v in files.items() if k != "float32")
    for attempt in (1, 2):
        folder = cached_export(source, export, kind=kind, required=required, derived=derived)
        try:
            open_(folder)
            return folder
        except Exception as exc:
            if attempt == 2:
                raise CisrankError(
                    f"cannot load the ONNX export of {what} ({folder}): {first_line(exc)}"
                ) from exc
            log.warning(
                "the ONNX export %s does not load (%s): making it again", folder, first_line(exc)
            )
            discard(folder)
    raise AssertionError("unreachable")  # pragma: no cover


def int8_lanes(compute_type: str, threads: int) -> tuple[int, ThreadPoolExecutor | None]:
    """(a session's intra-op threads, the lanes its batches run on). Dynamic int8 scores one
    row a batch (its activation scale is the batch's, so a score would move with its company),
    a product too small for a second thread to share: it runs a one-thread session on `threads`
    lanes at once instead (ONNX Runtime releases the GIL), 1.8x faster on 2 cores
    (bench/RESULTS.md), each score the one-thread session's whatever the thread count. Other
    compute types batch rows: `threads` intra-op threads, no lanes."""
    if compute_type != "int8" or threads <= 1:
        return threads, None
    return 1, ThreadPoolExecutor(threads, thread_name_prefix="onnx-int8")


def open_session(
    ort: Any,
    folder: Path,
    compute_type: str,
    threads: int,
    *,
    kind: str,
    export_format: int,
    files: Mapping[str, str],
    quantize: Callable[[Path], None],
) -> tuple[dict[str, Any], Any]:
    """An export's recorded facts and an ONNX Runtime CPU session on its graph for
    `compute_type` (int8 quantized from float32 once, recorded and checked with the export), on
    `threads` intra-op threads; an export of another kind or format is refused."""
    info: dict[str, Any] = json.loads((folder / PROVENANCE).read_text())
    if info.get("kind") != kind:
        raise CisrankError(f"{folder} holds no {kind} export")
    if info.get("format") != export_format:
        raise CisrankError(
            f"{folder} is an export of format {info.get('format', 1)}, not {export_format} "
            "(an older cisrank made it)"
        )
    if compute_type == "int8":

        def make() -> None:
            log.info("quantizing %s to int8 (once)", folder)
            quantize(folder)

        make_derived(folder, files["int8"], make)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(
        str(folder / files[compute_type]), options, providers=["CPUExecutionProvider"]
    )
    return info, session


def make_derived(folder: Path, name: str, make: Callable[[], None]) -> None:
    """`folder/name`, a file made from an intact export by `make()` (the int8 graph), made once,
    recorded and checked with the export's own files, made again when damaged."""
    checked_cache.derived_file(folder, PROVENANCE, name, make, what="ONNX export")


def record(folder: Path) -> dict[str, Any]:
    """An export's record (read after the export was checked)."""
    return checked_cache.read_record(folder, PROVENANCE)


def identity(folder: Path) -> bytes:
    """What an export is, for fingerprints: its record without the checksums."""
    return checked_cache.identity(record(folder))


def export_module(
    module: Any,
    args: tuple,
    path: Path,
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_axes: Mapping[str, Mapping[int, str]],
) -> None:
    """`torch.onnx.export` of `module` (in eval mode) traced on `args`, as described above. The
    exporter needs the `onnx` package (torch raised its bare `OnnxExporterError` without it);
    a model it cannot export is one line saying so."""
    require("onnx", "onnx", EXPORTING)
    import torch

    with torch.inference_mode(), warnings.catch_warnings():
        # the tracer warns about every shape-dependent branch of the mask code; each export is
        # checked against its torch model on other shapes and padding by its tests
        warnings.simplefilter("ignore")
        try:
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
        except torch.onnx.OnnxExporterError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "exporter error"
            raise CisrankError(
                f"torch cannot export this model to ONNX ({first}): use --backend torch"
            ) from exc


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
    require("onnx", "onnx", EXPORTING)
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
