"""Watching a call that should block: is it really waiting, and what does it return?

A wait test that pushes right after starting its waiter proves nothing: the push may come
first, and a wait that never blocks still returns the new version. :class:`BlockingCall`
runs the call on a thread and lets the test know, before it pushes, that the thread is
*inside* the backend's ``wait`` (its frame is on the thread's stack) and has stayed there,
without returning, for a while.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from types import CodeType
from typing import Any, Callable

__all__ = ["BlockingCall", "code_of"]

#: How long a check may take before the suite calls the call hung (a loaded machine).
PATIENCE = 30.0


def code_of(function: Any) -> CodeType | None:
    """The code object running when ``function`` (a function or method) is called, or
    ``None`` for one without Python code (a builtin)."""
    function = getattr(function, "__func__", function)
    return getattr(function, "__code__", None)


class BlockingCall:
    """``fn()`` on a daemon thread, started at once; ``what`` names it in messages."""

    def __init__(self, fn: Callable[[], Any], what: str) -> None:
        self.what = what
        self._outcome: list[Any] = []
        self._thread = threading.Thread(
            target=self._run, args=(fn,), daemon=True, name="varsync-blocking-call"
        )
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._outcome.append((True, fn()))
        except BaseException as exc:  # handed to the test by result()
            self._outcome.append((False, exc))

    def _describe_outcome(self) -> str:
        ok, value = self._outcome[0]
        return f"returned {value!r}" if ok else f"raised {type(value).__name__}: {value}"

    def wait_until_inside(self, codes: Sequence[CodeType | None]) -> None:
        """Return once the thread is running one of ``codes`` (e.g. the backend's
        ``wait``); fail if the call ends first, or if it never gets there."""
        wanted = {code for code in codes if code is not None}
        assert wanted, "no Python code to look for"
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            if not self._thread.is_alive():
                raise AssertionError(
                    f"{self.what} {self._describe_outcome()} before anything was pushed; "
                    "it should have blocked until the push"
                )
            frame = sys._current_frames().get(self._thread.ident or -1)
            while frame is not None:
                if frame.f_code in wanted:
                    return
                frame = frame.f_back
            time.sleep(0.001)
        raise AssertionError(f"{self.what} never started waiting within {PATIENCE:g} s")

    def assert_still_blocked(self, seconds: float) -> None:
        """The call has not returned ``seconds`` from now (nothing was pushed meanwhile)."""
        self._thread.join(seconds)
        if not self._thread.is_alive():
            raise AssertionError(
                f"{self.what} {self._describe_outcome()} though nothing was pushed; it "
                "should have blocked until the push"
            )

    def result(self, timeout: float = PATIENCE) -> Any:
        """What the call returned (its exception re-raised); fail if it is still
        running after ``timeout`` seconds."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"{self.what} did not return within {timeout:g} s")
        ok, value = self._outcome[0]
        if not ok:
            raise value
        return value
