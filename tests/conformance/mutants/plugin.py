"""The entry-point module of the mutation tests' fake distribution: one scheme for each
reference backend (of protocol 1, and the 0.2-protocol ones the registry adapts) and one
per broken variant, each a ``"module:Class"`` string, as docs/plugins.md shows."""

from __future__ import annotations

from typing import Any

import varsync
from mutants.broken import VARIANTS
from mutants.broken_leaves import LEAF_VARIANTS, NOT_ALWAYS_CAUGHT
from mutants.broken_patches import PATCH_VARIANTS

REFERENCE_SCHEME = "vsqlite"
LEAF_REFERENCE_SCHEME = "vsqlite-leaves"
PATCH_REFERENCE_SCHEME = "vsqlite-patches"
#: The same two references as they were written to the 0.2 protocol (``legacy_reference``,
#: ``legacy_reference_leaves``): varsync adapts them at registration, with a warning.
LEGACY_REFERENCE_SCHEME = "vsqlite-legacy"
LEGACY_LEAF_REFERENCE_SCHEME = "vsqlite-leaves-legacy"


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
    registry.add(
        PATCH_REFERENCE_SCHEME,
        "mutants.reference_patches:SqlitePatchBackend",
        description="the mutation tests' reference with element deltas: anchors and patches",
    )
    registry.add(
        LEGACY_REFERENCE_SCHEME,
        "mutants.legacy_reference:SqliteBackend",
        description="the 0.2-protocol reference, adapted by varsync._backends.legacy",
    )
    registry.add(
        LEGACY_LEAF_REFERENCE_SCHEME,
        "mutants.legacy_reference_leaves:SqliteLeafBackend",
        description="the 0.2-protocol leaf-version reference, adapted",
    )
    for scheme, variant in {**VARIANTS, **LEAF_VARIANTS, **PATCH_VARIANTS, **NOT_ALWAYS_CAUGHT}.items():
        registry.add(
            scheme, f"{variant.__module__}:{variant.__name__}", description=variant.__doc__ or ""
        )
