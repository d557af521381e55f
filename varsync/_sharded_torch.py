"""``parts_from_dtensors``: a rank's local shards of a torch ``state_dict`` of DTensors
(FSDP2's ``fully_shard``, tensor parallelism) as ``push_shard`` parts, with no
all-gather. Imports torch only when called."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from varsync._errors import ConfigurationError

__all__ = ["parts_from_dtensors"]


def parts_from_dtensors(state_dict: Mapping[str, Any]) -> dict[Any, Any]:
    """``{key: (index_ranges, local_tensor)}`` for each DTensor of ``state_dict`` this
    rank holds a non-empty block of; a block replicated over a mesh dimension is given
    only by the rank at coordinate 0 of that dimension, so that every element comes from
    exactly one rank. A plain tensor (not a DTensor) is given whole by global rank 0
    only (or always, without an initialised process group). A ``Partial`` placement
    (values still to be reduced) raises :class:`~varsync.ConfigurationError`."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    first = not dist.is_available() or not dist.is_initialized() or dist.get_rank() == 0
    parts: dict[Any, Any] = {}
    for key, value in state_dict.items():
        if not isinstance(value, DTensor):
            if first and isinstance(value, torch.Tensor):
                parts[key] = value.detach()
            continue
        placements = value.placements
        if any(p.is_partial() for p in placements):
            raise ConfigurationError(
                f"parts_from_dtensors: {key!r} has a Partial placement {placements}; "
                "reduce it (redistribute to Shard or Replicate) before pushing"
            )
        coordinate = value.device_mesh.get_coordinate()
        if coordinate is None:  # this rank is not in the tensor's mesh
            continue
        if any(p.is_replicate() and c != 0 for p, c in zip(placements, coordinate)):
            continue
        shape, offset = compute_local_shape_and_global_offset(
            value.shape, value.device_mesh, placements
        )
        if any(n == 0 for n in shape) and value.numel() > 0:
            continue  # an empty shard of an unevenly sharded tensor
        ranges = tuple((int(o), int(o) + int(n)) for o, n in zip(offset, shape))
        parts[key] = (ranges, value.to_local().detach())
    return parts
