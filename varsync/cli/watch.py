"""``varsync watch``: a live view of the tables at a URL, refreshed in the terminal.

Per table: its version, the push rate over the last refresh window (versions per second,
from two ``version`` calls an interval apart), its leaves and size, and the readers that
report what they hold (``container.readers``) with their lag, the table's version minus
theirs. ``rich`` (extra ``varsync[watch]``) is imported only when the command runs.
Strings read from the store (table names, reader ids, hosts) and error messages are shown
as text, never as rich markup, with control characters escaped (:func:`printable`): a
writer to the store must not be able to crash the view or drive the operator's terminal.
Ctrl-C ends it with status 0, the terminal restored.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

import varsync
from varsync import _nest as nest_lib
from varsync._config import redact
from varsync._errors import MissingDependencyError, UnsupportedError
from varsync.cli.formatting import human_size, printable
from varsync.cli.usage import PROG, UsageError

if TYPE_CHECKING:
    from rich.text import Text

#: Readers listed per table; the rest are counted.
MAX_READERS_SHOWN = 10


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    """Add the ``watch`` command to the ``commands`` subparsers."""
    watch = commands.add_parser(
        "watch",
        help="a live view of tables, versions, push rates and readers",
        description="Show the tables at URL, refreshed every --interval seconds until "
        "Ctrl-C: each one's version, push rate (versions/s over the last interval), "
        "leaves and size, and the readers that report what they hold, with their lag "
        "(the table's version minus the reader's). Needs rich: pip install "
        '"varsync[watch]".',
    )
    watch.add_argument("url", metavar="URL", help="e.g. redis://localhost:6379/0, shm://training")
    watch.add_argument(
        "--table",
        "-t",
        action="append",
        metavar="T",
        help="only this table (repeat for more; default: every table)",
    )
    watch.add_argument(
        "--interval",
        "-n",
        type=_seconds,
        default=1.0,
        metavar="S",
        help="seconds between refreshes (default 1)",
    )
    watch.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds to wait for the server (default 10)",
    )
    watch.add_argument(
        "--once",
        action="store_true",
        help="look twice, --interval apart (for the push rate), print the view once and exit",
    )
    watch.set_defaults(run=run)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0.05 <= value <= 3600):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an interval; expected seconds from 0.05 to 3600, e.g. 1 or 0.5"
        )
    return value


@dataclass
class TableView:
    """What one refresh shows of one table."""

    name: str
    version: int
    leaves: int
    nbytes: int
    #: versions per second over the last window; ``None`` before a second look
    rate: float | None = None
    #: the table's version went down since the last look (its history restarted)
    reset: bool = False
    #: ``None``: the backend keeps no reader registry
    readers: list[Any] | None = None


@dataclass
class Watcher:
    """Successive looks at a container's tables; each :meth:`look` returns the views."""

    store: Any
    tables: Sequence[str] | None
    _sizes: dict[str, Any] = field(default_factory=dict)
    _last: dict[str, Any] = field(default_factory=dict)

    def look(self) -> list[TableView]:
        names = list(self.tables) if self.tables else self.store.tables()
        now = time.monotonic()
        views = []
        for name in names:
            if name not in self._sizes:  # a table's signature never changes: read it once
                info = self.store.table_info(name)
                self._sizes[name] = (len(nest_lib.flatten(info.signature)), info.nbytes)
            leaves, nbytes = self._sizes[name]
            version = self.store.version(name)
            view = TableView(name, version, leaves, nbytes, readers=self._readers(name))
            last = self._last.get(name)
            if last is not None and now > last[1]:
                view.reset = version < last[0]
                if not view.reset:
                    view.rate = (version - last[0]) / (now - last[1])
            self._last[name] = (version, now)
            views.append(view)
        return views

    def _readers(self, name: str) -> list[Any] | None:
        try:
            return list(self.store.readers(name))
        except (AttributeError, UnsupportedError):  # an older varsync, or no registry
            return None


def render(
    url: str,
    backend: str,
    views: list[TableView],
    interval: float,
    live: bool,
    problem: str | None = None,
) -> Any:
    """The view as a rich renderable: a heading, the tables, then the readers."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    clock = time.strftime("%H:%M:%S")
    hint = f"every {interval:g} s, Ctrl-C to quit" if live else f"over {interval:g} s"
    how_many = f"{len(views)} table{'s' if len(views) != 1 else ''}"
    heading = Text(f"{printable(url)}  ({backend}, {how_many})  {clock}, {hint}", style="bold")
    parts: list[Any] = [heading]
    if problem:
        parts.append(Text(f"last refresh failed: {printable(problem)}", style="red"))
    tables = Table(show_edge=False, pad_edge=False, header_style="bold")
    for column, justify in (
        ("TABLE", "left"),
        ("VERSION", "right"),
        ("PUSHES/S", "right"),
        ("LEAVES", "right"),
        ("SIZE", "right"),
        ("READERS", "right"),
        ("MAX LAG", "right"),
    ):
        tables.add_column(column, justify=justify)  # type: ignore[arg-type]
    readers = Table(show_edge=False, pad_edge=False, header_style="bold")
    for column, justify in (
        ("TABLE", "left"),
        ("READER", "left"),
        ("HOST", "left"),
        ("HOLDS", "right"),
        ("LAG", "right"),
        ("SINCE", "right"),
    ):
        readers.add_column(column, justify=justify)  # type: ignore[arg-type]
    now = time.time()
    any_readers = False
    for view in views:
        if view.readers is None:
            count, worst = "n/a", "n/a"
        else:
            lags = [max(view.version - r.version, 0) for r in view.readers]
            count, worst = str(len(lags)), (str(max(lags)) if lags else "-")
        state = "empty" if view.version == 0 else str(view.version)
        tables.add_row(
            _literal(view.name),
            state,
            _rate(view),
            str(view.leaves),
            human_size(view.nbytes),
            count,
            worst,
        )
        for reader in (view.readers or [])[:MAX_READERS_SHOWN]:
            any_readers = True
            since = max(now - float(getattr(reader, "at", now)), 0.0)
            readers.add_row(
                _literal(view.name),
                _literal(reader.reader),
                _literal(getattr(reader, "host", "")),
                str(reader.version),
                str(max(view.version - reader.version, 0)),
                f"{since:.0f} s",
            )
        hidden = len(view.readers or []) - MAX_READERS_SHOWN
        if hidden > 0:
            readers.add_row(_literal(view.name), f"... and {hidden} more", "", "", "", "")
    parts.append(tables if views else Text("(no tables)"))
    if any_readers:
        parts += [Text(""), readers]
    return Group(*parts)


def _literal(value: Any) -> Text:
    """A string from the store as a table cell: its characters as they are (a ``str`` cell
    would be parsed as markup, and ``"[/]"`` raise), controls escaped."""
    from rich.text import Text

    return Text(printable(str(value)))


def _rate(view: TableView) -> str:
    if view.reset:
        return "reset"
    if view.rate is None:
        return "-"
    return f"{view.rate:.1f}"


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        from rich.console import Console
        from rich.live import Live
    except ImportError:
        raise MissingDependencyError(
            f'{PROG} watch needs rich, which is not installed: pip install "varsync[watch]"'
        ) from None
    if args.table and len(set(args.table)) != len(args.table):
        raise UsageError("a --table is given twice", f"{PROG} watch")
    where = redact(args.url)
    with varsync.connect(args.url, timeout=args.timeout) as store:
        backend = type(store.backend).__name__
        watcher = Watcher(store, args.table)
        views = watcher.look()  # errors here (no such table, no server) end the command
        terminal = out.isatty()
        console = Console(file=out, highlight=False, width=None if terminal else 120)
        if args.once:
            time.sleep(args.interval)
            console.print(render(where, backend, watcher.look(), args.interval, False))
            return 0
        problem: str | None = None
        try:
            if not terminal:  # piped: one view after another, as they come
                while True:
                    console.print(render(where, backend, views, args.interval, True, problem))
                    console.print()
                    time.sleep(args.interval)
                    views, problem = _refresh(watcher, views)
            with Live(
                render(where, backend, views, args.interval, True),
                console=console,
                auto_refresh=False,
                transient=False,
            ) as live:
                while True:
                    time.sleep(args.interval)
                    views, problem = _refresh(watcher, views)
                    live.update(
                        render(where, backend, views, args.interval, True, problem), refresh=True
                    )
        except KeyboardInterrupt:  # the way to quit: Live restored the terminal on its way out
            return 0


def _refresh(watcher: Watcher, views: list[TableView]) -> tuple[list[TableView], str | None]:
    """New views, or the last ones and why a look failed (a server gone: say so, keep
    trying at the next refresh)."""
    try:
        return watcher.look(), None
    except varsync.VarsyncError as exc:
        return views, " ".join(str(exc).split())
