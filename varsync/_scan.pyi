"""The compiled scan for changed elements (varsync/_scan.c)."""

from typing_extensions import Buffer

def changed(old: Buffer, new: Buffer, width: int, out: Buffer, most: int, /) -> int: ...
