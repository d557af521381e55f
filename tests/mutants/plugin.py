"""The entry-point module of the mutation tests' fake distribution: one scheme for each
reference backend and one per broken variant, each a ``"module:Class"`` string, as
docs/plugins.md shows."""

from __future__ import annotations

from typing import Any

import varsync
from mutants.broken import VARIANTS
from mutants.broken_leaves import LEAF_VARIANTS, NOT_ALWAYS_CAUGHT

REFERENCE_SCHEME = "vsqlite"
LEAF_REFERENCE_SCHEME = "vsqlite-leaves"


@varsync.hookimpl
def varsync_register_backends(registry: Any) -> None:
    registry.add(
        REFERENCE_SCHEME,
        "mutants.reference:SqliteBackend",
        description="the mutation tests' reference: tables in one SQLite file",
    )
    registry.add(
        LEAF_REFERENCE_SCHEME,
        "mutants.reference_leaves:SqliteLeafBackend",
        description="the mutation tests' reference with leaf versions: a row per leaf",
    )
    for scheme, variant in {**VARIANTS, **LEAF_VARIANTS, **NOT_ALWAYS_CAUGHT}.items():
        registry.add(
            scheme, f"{variant.__module__}:{variant.__name__}", description=variant.__doc__ or ""
        )
