"""The entry-point module of the mutation tests' fake distribution: one scheme for the
reference backend and one per broken variant, each a ``"module:Class"`` string, as
docs/plugins.md shows."""

from __future__ import annotations

from typing import Any

import varsync
from mutants.broken import VARIANTS

REFERENCE_SCHEME = "vsqlite"


@varsync.hookimpl
def varsync_register_backends(registry: Any) -> None:
    registry.add(
        REFERENCE_SCHEME,
        "mutants.reference:SqliteBackend",
        description="the mutation tests' reference: tables in one SQLite file",
    )
    for scheme, variant in VARIANTS.items():
        registry.add(scheme, f"mutants.broken:{variant.__name__}", description=variant.__doc__ or "")
