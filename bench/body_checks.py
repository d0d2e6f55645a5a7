"""The cost of refusing a hostile body, as a ratio to `json.loads` reading the same bytes.

Two checks were not linear: locating the one integer too long for Python among thousands of
4,300-digit runs (the regex restarted at every digit: 74 s on 16.6 MB), and locating a lone
surrogate under 63 levels of nesting (the body was re-encoded once per level: 3.9 s on 15 MB). Both
are one pass at C speed now (`cisrank.api.body`). A wall-clock bound in a unit test failed on a
loaded CI host (the ratio moves with the CPU and its load), so the speed is measured here,
interleaved against the parser in one process, and the unit tests check what the locators answer
and, where it can be counted, the work they hand to json.

    .venv/bin/python bench/body_checks.py            # full size (about 15 MB a body)
    .venv/bin/python bench/body_checks.py --scale 0.1

Each body is refused `--repeats` times, alternating with `json.loads` of the same body (of its
well-formed part, for the long integer, which the parser cannot read), and the median of each is
reported with their ratio (`bench/results/body_checks.json`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from common import add_tag_option, report, result_name

from cisrank.api.body import BodyError, read_json_body


def long_integers(scale: float) -> tuple[bytes, bytes]:
    """The long-integer body: runs of 4,300 digits (which Python reads), then one of 5,000."""
    runs = b",".join([b"1" * 4300] * max(1, int(3860 * scale)))
    head = b'{"query": "q", "x": [' + runs + b"]"
    return head + b', "top_n": -' + b"7" * 5000 + b"}", head + b"}"


def nested_surrogate(items: int) -> bytes:
    """The nested-surrogate body: `items` strings of 40 characters then a lone surrogate, at the
    bottom of 63 levels of arrays and objects, the big member first (also bench/hostile.py's)."""
    value: object = ["x" * 40] * items + ["\ud800"]
    for i in range(62):
        value = {"k": value, "z": 0} if i % 2 else [value, 0]
    return json.dumps(value).encode()


def deep_surrogate(scale: float) -> tuple[bytes, bytes]:
    raw = nested_surrogate(max(1, int(350_000 * scale)))
    return raw, raw


def many_members(scale: float) -> tuple[bytes, bytes]:
    """A body of many members: 400,000 tiny arrays, then a lone surrogate."""
    n = max(1, int(400_000 * scale))
    raw = b'{"documents": [' + b",".join([b"[]"] * n) + b', "\\ud800"]}'
    return raw, raw


def refuse(raw: bytes) -> None:
    try:
        read_json_body(raw, None)
    except BodyError:
        return
    raise AssertionError("the body was read: the benchmark's body is wrong")


def median_seconds(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """The median wall seconds of each call, the calls alternated round by round."""
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            t = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - t)
    return {name: statistics.median(values) for name, values in seconds.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="body size, 1 = about 15 MB")
    ap.add_argument("--repeats", type=int, default=5)
    add_tag_option(ap)
    args = ap.parse_args()
    payload: dict[str, object] = {"scale": args.scale, "repeats": args.repeats}
    for name, build in [
        ("long_integer", long_integers),
        ("deep_surrogate", deep_surrogate),
        ("many_members", many_members),
    ]:
        hostile, readable = build(args.scale)
        refuse(hostile)  # warm: the first call pays for imports and numpy's first allocations
        median = median_seconds(
            {"locate": lambda h=hostile: refuse(h), "parse": lambda r=readable: json.loads(r)},
            args.repeats,
        )
        payload[f"{name}_mb"] = round(len(hostile) / 1e6, 2)
        payload[f"{name}_locate_s"] = round(median["locate"], 4)
        payload[f"{name}_parse_s"] = round(median["parse"], 4)
        payload[f"{name}_ratio"] = round(median["locate"] / median["parse"], 2)
    report(result_name("body_checks", args.tag), payload)


if __name__ == "__main__":
    main()
