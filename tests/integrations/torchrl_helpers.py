"""A policy whose every action says which weights produced it, for tests/integrations/test_torchrl.py.

``VersionActor`` holds one parameter and one buffer, and acts ``weight + offset`` whatever
it observes. ``set_version(policy, k)`` gives it the weights of version ``k``: each frame
of a collected batch then tells which version acted (``acted_versions``), and a frame of a
policy caught between two versions (new parameter, old buffer) matches none. It lives in
a module of its own so that spawned collector workers can import it.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from tensordict.nn import TensorDictModule

#: The action of a step that no version (of those asked about) produced.
NO_VERSION = -1


class VersionActor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.register_buffer("offset", torch.zeros(1))

    def forward(self, th: torch.Tensor) -> torch.Tensor:
        return (self.weight + self.offset).expand(*th.shape, 1).clone()


def weights_of(version: int) -> tuple[float, float]:
    """The (parameter, buffer) values of ``version``: apart for every version, and a
    mix of two versions' (one's parameter, the other's buffer) is neither's."""
    return 0.01 * version, 0.0001 * version


def set_version(policy: TensorDictModule, version: int) -> None:
    weight, offset = weights_of(version)
    with torch.no_grad():
        policy.module.weight.fill_(weight)
        policy.module.offset.fill_(offset)


def make_version_policy(version: int = 0) -> TensorDictModule:
    policy = TensorDictModule(VersionActor(), in_keys=["th"], out_keys=["action"])
    set_version(policy, version)
    return policy


def action_of(version: int) -> torch.Tensor:
    """What a policy of ``version`` acts, computed as the policy computes it."""
    weight, offset = weights_of(version)
    return torch.tensor([weight]) + torch.tensor([offset])


def acted_versions(batch: Any, versions: Sequence[int]) -> torch.Tensor:
    """The version that acted each frame of ``batch`` (one of ``versions``, else
    ``NO_VERSION``), in the batch's shape."""
    actions = batch["action"][..., 0]
    out = torch.full(actions.shape, NO_VERSION, dtype=torch.long)
    for version in versions:
        out[actions == action_of(version)[0]] = version
    return out


def old_then_new(acted: torch.Tensor, old: int, new: int) -> bool:
    """Frames of ``old``, then at most one of neither (acted while an update was half
    copied: one tensor new, the other old), then frames of ``new``: one trajectory
    collected across an update, in time order (``acted`` from :func:`acted_versions`)."""
    steps = acted.flatten().tolist()
    at = 0
    while at < len(steps) and steps[at] == old:
        at += 1
    if at < len(steps) and steps[at] == NO_VERSION:
        at += 1
    return all(step == new for step in steps[at:])


def stale_frames(batch: Any, version: int) -> int:
    """How many frames of ``batch`` some other weights than ``version``'s acted."""
    return int((batch["action"][..., 0] != action_of(version)[0]).sum())
