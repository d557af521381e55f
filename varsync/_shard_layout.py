"""Where each rank's part of a sharded table lies (``docs/sharded.md``): blocks of leaves
given as index ranges, checked, named, and put together again.

A part is one block of one leaf of the table's full signature: the leaf's flat index and
a ``(start, stop)`` range per dimension (a whole leaf: its full ranges; a scalar: none).
A rank's parts are stored as one table whose signature's keys *are* the blocks
(``"L000003[0:4,0:8]"``), so a reader learns every rank's layout from the part tables'
signatures alone, and the layout cannot change under a table without
:class:`~varsync.TableExistsError`. One more key, :data:`CHANGES_KEY` (sorting after
every block's), holds per block the training step at which its content last changed
(``varsync._sharded``), for readers that fetch only what changed (``varsync._sharded_reads``),
and :data:`HELD_KEY`, last, the part table's recent versions and the step each holds
(``varsync._shard_patches``), for readers that fetch only the elements that changed.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from varsync import _delta as delta
from varsync import _nest as nest_lib
from varsync import _signature as sig
from varsync._errors import ConfigurationError, CorruptDataError, SignatureMismatchError
from varsync._signature import Spec

__all__ = [
    "Block",
    "Ranges",
    "CHANGES_KEY",
    "HELD_KEY",
    "HELD_ROWS",
    "held_rows",
    "held_index",
    "block_key",
    "parse_key",
    "part_signature",
    "changes_index",
    "part_blocks",
    "layout_of",
    "check_cover",
    "intersection",
    "copy_block",
    "volume",
    "full_ranges",
    "checked_ranges",
    "tiled",
]

Ranges = tuple[tuple[int, int], ...]

_KEY = re.compile(r"^L(\d+)\[([0-9:,]*)\]$")
#: A part table's key of the steps at which its blocks last changed (int64, one per
#: block in flat order); ``~`` sorts after the blocks' ``L``, so it is the last leaf.
CHANGES_KEY = "~changed"
#: A part table's key of its latest versions and the training step each holds, newest
#: first (int64 ``(version, step)`` rows, :data:`HELD_ROWS` of them, unused ones ``-1``):
#: a reader holding one of those steps asks for the element patches since that version.
#: It sorts after :data:`CHANGES_KEY` (``h`` after ``c``): the last leaf.
HELD_KEY = "~held"
#: The rows of :data:`HELD_KEY`.
HELD_ROWS = 8


class Block(NamedTuple):
    """One block: leaf ``leaf`` (flat index in the full signature), ``ranges`` of it."""

    leaf: int
    ranges: Ranges


def full_ranges(spec: Spec) -> Ranges:
    return tuple((0, int(n)) for n in spec.shape)


def volume(ranges: Ranges) -> int:
    return math.prod(stop - start for start, stop in ranges)


def block_key(block: Block) -> str:
    """The key naming ``block`` in a part table's signature (sorts by leaf, then ranges)."""
    inner = ",".join(f"{start}:{stop}" for start, stop in block.ranges)
    return f"L{block.leaf:06d}[{inner}]"


def parse_key(key: Any, where: str) -> Block:
    found = _KEY.match(key) if isinstance(key, str) else None
    if found is None:
        raise CorruptDataError(f"{where}: {key!r} does not name a block of a leaf")
    inner = found.group(2)
    ranges = tuple(
        (int(a), int(b)) for a, b in (item.split(":") for item in inner.split(",") if item)
    )
    return Block(int(found.group(1)), ranges)


def checked_ranges(given: Any, spec: Spec, path: Any) -> Ranges:
    """``given`` as ranges within ``spec``'s shape, else :class:`ConfigurationError`."""
    try:
        ranges = tuple((int(start), int(stop)) for start, stop in given)
    except (TypeError, ValueError):
        ranges = None
    if ranges is None or len(ranges) != len(spec.shape):
        raise ConfigurationError(
            f"part {path!r}: index ranges {given!r} must be one (start, stop) per dimension "
            f"of the leaf's shape {spec.shape}"
        )
    for (start, stop), size in zip(ranges, spec.shape):
        if not 0 <= start < stop <= size and not (start == stop == 0 == size):
            raise ConfigurationError(
                f"part {path!r}: index ranges {given!r} are not a non-empty block of the "
                f"leaf's shape {spec.shape}"
            )
    return ranges


def part_blocks(signature: Any, parts: Mapping[Any, Any]) -> dict[Block, np.ndarray]:
    """A ``push_shard``'s ``parts`` (``{path: value}`` for a whole leaf, ``{path:
    (index_ranges, value)}`` for a block of one) as checked arrays by block. A path
    names one leaf of ``signature``; each value must have the leaf's dtype and the
    block's shape. Blocks of one rank must not overlap."""
    if not isinstance(parts, Mapping) or not parts:
        raise ConfigurationError(
            f"push_shard takes a non-empty mapping of leaf paths to parts, got {parts!r:.80}"
        )
    paths = delta.LeafPaths(signature)
    blocks: dict[Block, np.ndarray] = {}
    for path, given in parts.items():
        node, indices, walked = paths.leaf_indices(path)
        if len(indices) != 1:
            raise ConfigurationError(
                f"part {path!r} names an inner node of {len(indices)} leaves; a part is "
                "one leaf or a block of one (give each leaf its own path)"
            )
        spec: Spec = node
        if isinstance(given, tuple) and len(given) == 2 and not isinstance(given[0], np.ndarray):
            ranges, value = checked_ranges(given[0], spec, path), given[1]
        else:
            ranges, value = full_ranges(spec), given
        block_spec = Spec([stop - start for start, stop in ranges], spec.dtype)
        try:
            array = sig.flatten_values(block_spec, value)[0]
        except SignatureMismatchError as exc:
            raise SignatureMismatchError(
                f"push_shard, part {nest_lib.format_path(walked)} {list(ranges)}: {exc}"
            ) from None
        block = Block(indices[0], ranges)
        for other in blocks:
            if other.leaf == block.leaf and intersection(other.ranges, ranges) is not None:
                raise ConfigurationError(
                    f"push_shard: parts {list(other.ranges)} and {list(ranges)} of "
                    f"{nest_lib.format_path(walked)} overlap"
                )
        blocks[block] = array
    return blocks


def part_signature(blocks: Mapping[Block, np.ndarray]) -> dict[str, Spec]:
    """The signature of a part table holding ``blocks``: one key per block,
    :data:`CHANGES_KEY` and :data:`HELD_KEY`."""
    out = {block_key(b): Spec(a.shape, a.dtype) for b, a in blocks.items()}
    out[CHANGES_KEY] = Spec([len(blocks)], np.int64)
    out[HELD_KEY] = Spec([HELD_ROWS, 2], np.int64)
    return out


def held_rows(rows: Sequence[tuple[int, int]]) -> np.ndarray:
    """A :data:`HELD_KEY` leaf of ``rows`` (``(version, step)``, newest first; the
    first :data:`HELD_ROWS` are kept)."""
    out = np.full((HELD_ROWS, 2), -1, np.int64)
    kept = list(rows)[:HELD_ROWS]
    if kept:
        out[: len(kept)] = kept
    return out


def _cuts(size: int, pieces: int) -> list[tuple[int, int]]:
    """``size`` cut into ``pieces`` ranges as even as possible (at most ``size``)."""
    pieces = max(1, min(pieces, size))
    edges = [size * k // pieces for k in range(pieces + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _pieces(n: Any) -> bool:
    return isinstance(n, (int, np.integer)) and not isinstance(n, bool) and bool(n >= 1)


def _tile_counts(tiles: Any) -> tuple[int, ...] | int:
    """``tiles`` checked: an int >= 1, or a sequence of them."""
    if _pieces(tiles):
        return int(tiles)
    sequence = isinstance(tiles, Sequence) and not isinstance(tiles, str) and tiles
    if sequence and all(_pieces(n) for n in tiles):
        return tuple(int(n) for n in tiles)
    raise ConfigurationError(
        f"tiles must be an int >= 1 (pieces along each block's last dimension) or a "
        f"non-empty sequence of them (pieces per dimension, from the first), got {tiles!r}"
    )


def tiled(blocks: Mapping[Block, np.ndarray], tiles: Any) -> dict[Block, np.ndarray]:
    """Each block cut into tiles, each a block of its own: ``tiles`` an int cuts every
    block of one dimension or more into that many pieces along its last dimension, a
    sequence gives the pieces per dimension from the first (dimensions past it: one
    piece); pieces are as even as the dimension allows, and a dimension shorter than
    its pieces is cut into single elements. A reader that wants part of a block then
    needs only the tiles it intersects (``docs/sharded.md``, "Readers with another
    sharding"). A tile of a block's columns is not contiguous in the rank's array: it is
    copied here, once (the push then sends the copy)."""
    counts = _tile_counts(tiles)
    if counts == 1:
        return dict(blocks)
    out: dict[Block, np.ndarray] = {}
    for block, array in blocks.items():
        ndim = len(block.ranges)
        if isinstance(counts, int):
            per_dim = [1] * ndim
            if ndim:
                per_dim[-1] = counts
        else:
            per_dim = [counts[d] if d < len(counts) else 1 for d in range(ndim)]
        cuts = [_cuts(stop - start, n) for (start, stop), n in zip(block.ranges, per_dim)]
        if all(len(c) == 1 for c in cuts):  # a scalar, or no dimension cut: as it is
            out[block] = array
            continue
        for local in itertools.product(*cuts):
            ranges = tuple(
                (start + a, start + b) for (start, _), (a, b) in zip(block.ranges, local)
            )
            tile = array[tuple(slice(a, b) for a, b in local)]
            out[Block(block.leaf, ranges)] = np.ascontiguousarray(tile)
    return out


def layout_of(part_signature: Any, where: str) -> list[Block]:
    """The blocks a part table holds, in its flat order (its signature's sorted keys,
    :data:`CHANGES_KEY` and :data:`HELD_KEY` left out)."""
    if not isinstance(part_signature, Mapping):
        raise CorruptDataError(f"{where}: a part table's signature must be a mapping of blocks")
    keys = nest_lib.sorted_keys(part_signature)
    return [parse_key(key, where) for key in keys if key not in (CHANGES_KEY, HELD_KEY)]


def changes_index(part_signature: Mapping[Any, Any]) -> int | None:
    """The flat index of a part table's :data:`CHANGES_KEY` leaf (after its blocks), or
    ``None`` for a part table without one: a reader then reads it whole."""
    if CHANGES_KEY not in part_signature:
        return None
    keys = nest_lib.sorted_keys(part_signature)
    index = keys.index(CHANGES_KEY)
    spec = part_signature[CHANGES_KEY]
    last = len(keys) - (2 if HELD_KEY in part_signature else 1)
    if (
        index != last
        or not isinstance(spec, Spec)
        or spec.shape != (index,)
        or spec.dtype != np.int64
    ):
        raise CorruptDataError(
            f"a part table's {CHANGES_KEY!r} must follow its blocks, int64 of one element "
            f"per block ({index}), got {spec!r}"
        )
    return index


def held_index(part_signature: Mapping[Any, Any]) -> int | None:
    """The flat index of a part table's :data:`HELD_KEY` leaf (its last), or ``None``
    for a part table without one (made before it): readers then fetch changed blocks
    whole."""
    if HELD_KEY not in part_signature:
        return None
    keys = nest_lib.sorted_keys(part_signature)
    index = keys.index(HELD_KEY)
    spec = part_signature[HELD_KEY]
    if (
        index != len(keys) - 1
        or CHANGES_KEY not in part_signature
        or not isinstance(spec, Spec)
        or spec.shape != (HELD_ROWS, 2)
        or spec.dtype != np.int64
    ):
        raise CorruptDataError(
            f"a part table's {HELD_KEY!r} must be its last leaf, after {CHANGES_KEY!r}, "
            f"int64 of shape ({HELD_ROWS}, 2), got {spec!r}"
        )
    return index


def check_cover(table: str, specs: Sequence[Spec], layouts: Mapping[int, list[Block]]) -> None:
    """Raise :class:`ConfigurationError` unless the ranks' blocks cover every element of
    every leaf exactly once (inside its shape, no overlap, nothing missing)."""
    by_leaf: dict[int, list[tuple[int, Ranges]]] = {}
    for rank, blocks in layouts.items():
        for block in blocks:
            if not 0 <= block.leaf < len(specs):
                raise ConfigurationError(
                    f"sharded table {table!r}: rank {rank} holds leaf {block.leaf}, and the "
                    f"signature has {len(specs)} leaves"
                )
            by_leaf.setdefault(block.leaf, []).append((rank, block.ranges))
    for leaf, spec in enumerate(specs):
        held = by_leaf.get(leaf, [])
        for i, (rank_a, a) in enumerate(held):
            for rank_b, b in held[i + 1 :]:
                if intersection(a, b) is not None:
                    raise ConfigurationError(
                        f"sharded table {table!r}: leaf {leaf} {spec}: ranks {rank_a} and "
                        f"{rank_b} both hold elements of it ({list(a)} and {list(b)}); give "
                        "each element to one rank (a replicated leaf: one rank pushes it)"
                    )
        covered = sum(volume(ranges) for _, ranges in held)
        if covered != spec.size:
            raise ConfigurationError(
                f"sharded table {table!r}: the ranks' parts hold {covered} of the "
                f"{spec.size} elements of leaf {leaf} {spec}; every element must be pushed "
                "by exactly one rank"
            )


def intersection(a: Ranges, b: Ranges) -> Ranges | None:
    """The block common to ``a`` and ``b`` (same rank), or ``None`` if they are apart."""
    common = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
    if any(start >= stop for start, stop in common):
        return None
    return common


def copy_block(dest: np.ndarray, dest_at: Ranges, source: np.ndarray, source_at: Ranges) -> int:
    """Copy the elements common to ``dest`` (which holds the block ``dest_at``) and
    ``source`` (the block ``source_at``); return how many were copied."""
    common = intersection(dest_at, source_at)
    if common is None:
        return 0
    into = tuple(slice(s - d0, e - d0) for (s, e), (d0, _) in zip(common, dest_at))
    out_of = tuple(slice(s - s0, e - s0) for (s, e), (s0, _) in zip(common, source_at))
    dest[into] = source[out_of]
    return volume(common)
