"""Pin every dependency of cisrank at its declared floor, for `make test-min`.

Reads `[project] dependencies` and the optional extras named on the command line from
pyproject.toml and prints one `name==floor` line per requirement that has a `>=` floor, so that
`pip install -c <output> -e .[extras]` installs the oldest versions the project claims to support:
a floor that is too low shows up as a failing test instead of a user's bug report. `--keep
NAME==VERSION` replaces a pin (torch stays on the CPU wheel the dev machines use). The `dev` extra
is test tooling, not what users install, and is left unpinned unless named.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*?)\s*(;.*)?$")


def floor_pins(requirements: list[str]) -> dict[str, str]:
    """`name` -> `name==floor` for each requirement with a `>=` specifier; the name is kept as
    written, extras are dropped (a constraint file may not carry them)."""
    pins: dict[str, str] = {}
    for req in requirements:
        match = _REQ.match(req)
        if match is None:
            raise ValueError(f"cannot parse requirement {req!r}")
        name, _extras, specs, _marker = match.groups()
        floors = [s.strip()[2:].strip() for s in specs.split(",") if s.strip().startswith(">=")]
        if floors:
            pins[_normalize(name)] = f"{name}=={floors[0]}"
    return pins


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def constraints(pyproject: Path, extras: list[str], keep: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    optional = project.get("optional-dependencies", {})
    requirements = list(project["dependencies"])
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"unknown extra '{extra}': one of {', '.join(optional)}")
        # `all` style extras name the project itself; their parts are listed separately.
        requirements += [r for r in optional[extra] if not r.startswith(project["name"])]
    pins = floor_pins(requirements)
    for pin in keep:
        name, sep, _version = pin.partition("==")
        if not sep:
            raise SystemExit(f"--keep takes NAME==VERSION, got {pin!r}")
        pins[_normalize(name)] = pin
    return [pins[k] for k in sorted(pins)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--extras",
        default="minilm,dense,lucene,train,serve",
        help="comma-separated extras whose floors are pinned too",
    )
    ap.add_argument(
        "--keep",
        action="append",
        default=[],
        metavar="NAME==VERSION",
        help="pin this version instead of the floor (repeatable)",
    )
    ap.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    args = ap.parse_args(argv)
    extras = [e for e in args.extras.split(",") if e]
    sys.stdout.write(
        "".join(line + "\n" for line in constraints(args.pyproject, extras, args.keep))
    )


if __name__ == "__main__":
    main()
