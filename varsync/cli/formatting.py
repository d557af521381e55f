"""Sizes, durations and columns, as the commands read and print them."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import TextIO

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
    "K": 2**10,
    "M": 2**20,
    "G": 2**30,
}


def parse_size(text: str) -> int:
    """``"40MB"`` -> 40_000_000, ``"1GiB"`` -> 2**30, ``"512"`` -> 512 (bytes)."""
    cleaned = str(text).strip().replace("_", "").upper()
    number = cleaned.rstrip("KMGTIB")
    unit = cleaned[len(number) :].strip()
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    if unit not in _UNITS or not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; expected bytes like 40MB, 400MB, 1GiB, 512KB or 1000"
        )
    return int(value * _UNITS[unit])


def human_size(nbytes: int) -> str:
    """``41943040`` -> ``"40.0 MiB"``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def printable(text: str) -> str:
    """``text`` with each character a terminal would act on or hide written as its Python
    escape (ESC as the four characters ``\\x1b``): C0 and C1 controls, DEL, line
    separators, bidi overrides, zero-width and other format characters. For strings read
    from a store, which anyone who can write there chose."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def count(n: int, one: str, many: str) -> str:
    """``count(1, "leaf", "leaves")`` -> ``"1 leaf"``."""
    return f"{n} {one if n == 1 else many}"


def duration(seconds: float) -> str:
    """``0.0123`` -> ``"12.3 ms"``."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def print_columns(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    """``rows`` (the first one a heading) in columns; the last column is not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)] + [row[-1]]
        print("  ".join(cells).rstrip(), file=out)
