"""The core's one wait loop: look at a table's head, and while it has not changed sleep
on the backend's notification (:class:`~varsync.backend.SupportsBlockingWait`) or poll
with a growing interval, until a deadline."""

from __future__ import annotations

import time
from typing import Any

from varsync._backends.base import (
    BLOCK_SLICE,
    POLL_MAX,
    POLL_START,
    Backend,
    Head,
    SupportsBlockingWait,
    remaining,
)
from varsync._errors import PullTimeoutError
from varsync._history import UNKNOWN

__all__ = ["wait_for_change"]


def wait_for_change(
    backend: Backend,
    name: str,
    newer_than: int,
    epoch: Any,
    deadline: float,
    answer_by: float,
    limit: float | None,
) -> Head:
    """The table's head once its version is not ``newer_than``, or its epoch not
    ``epoch`` (:data:`~varsync._history.UNKNOWN`: any), waiting until ``deadline`` (then
    :class:`PullTimeoutError`, for a wait of ``limit`` seconds). Each look at the head
    is bounded by ``answer_by``: the deadline, or later for a call that does not wait
    (``timeout=0``) but still gives the server its time to answer."""
    interval = POLL_START
    metered = getattr(backend, "waited", None)
    start = time.perf_counter()
    failed = True
    try:
        while True:
            head = backend.head(name, max(deadline, answer_by))
            if head.version != newer_than or (epoch is not UNKNOWN and head.epoch != epoch):
                failed = False
                return head
            left = remaining(deadline)
            if left <= 0:
                raise PullTimeoutError(
                    f"table {name!r} at {backend.url} stayed at version {head.version} "
                    f"(waiting for a version above {newer_than}) for {limit:g} s"
                )
            if isinstance(backend, SupportsBlockingWait):
                backend.block(name, newer_than, time.monotonic() + min(left, BLOCK_SLICE))
            else:
                time.sleep(min(interval, left))
                interval = min(interval * 2, POLL_MAX)
    finally:
        if metered is not None:  # varsync._metrics: a wait that timed out waited too
            metered(name, time.perf_counter() - start, failed)
