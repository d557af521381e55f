"""The command line's errors: a line that does not parse (exit status 2), and any other
error as one line."""

from __future__ import annotations

import argparse

from varsync._errors import VarsyncError

PROG = "varsync"


class UsageError(Exception):
    """The command line does not parse; ``str`` is the one-line reason."""

    def __init__(self, message: str, prog: str) -> None:
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message, self.prog)


def one_line(exc: BaseException) -> str:
    """``exc`` as one line, prefixed with its type unless it is one of varsync's errors."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if not isinstance(exc, VarsyncError):
        text = f"{type(exc).__name__}: {text}"
    return text
