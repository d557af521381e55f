"""What the suite's mixins share: the fixtures of :class:`_Base` (``url``, the one a
backend author must give, and ``connect``, ``make_tables``, ``store`` built on it), the
signatures the tests push (:data:`SMALL`, :data:`CONSISTENCY`) and how a test tells that
a waiter is waiting."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Callable

import pytest

import varsync
from varsync._backends.base import Backend
from varsync._config import resolve
from varsync._registry import backend_class
from varsync.testing.blocking import code_of

TableMaker = Callable[[Mapping[str, Any]], str]

#: How long a waiter must stay blocked, with nothing pushed, before a test pushes: a wait
#: that returns without a push (at once, or after a poll) shows itself meanwhile.
BLOCKED_SECONDS = 0.2

#: The table ``variables`` of the ``store`` fixture: a small mixed nest.
SMALL = {
    "policy": [varsync.Spec((3, 2), "float32"), varsync.Spec((2,), "float32")],
    "train_step": varsync.Spec((), "int64"),
}

#: Several leaves of some size, for the tests whose pulls must never mix two versions.
CONSISTENCY = {
    "a": varsync.Spec((256, 64), "float32"),
    "b": [varsync.Spec((1000,), "float32"), varsync.Spec((3, 3), "float64")],
    "step": varsync.Spec((), "int64"),
}


def _wait_codes(container: Any) -> list[Any]:
    """The code of the core's wait loop: a thread running it is waiting."""
    from varsync._waiting import wait_for_change

    return [code_of(wait_for_change)]


class _Base:
    """Fixtures shared by the mixins; ``url`` is the one a backend author must give."""

    # On the class, so the tests of every subclass carry the marker too.
    pytestmark = [pytest.mark.varsync_conformance]

    @pytest.fixture
    def url(self) -> str:
        raise NotImplementedError(
            "a conformance test class must define a `url` fixture returning the URL of a "
            "fresh, empty namespace of the backend under test"
        )

    @pytest.fixture
    def connect_options(self) -> dict[str, Any]:
        return {}

    @pytest.fixture
    def backend_cls(self, url: str, connect_options: dict[str, Any]) -> type[Backend]:
        return backend_class(resolve(url, dict(connect_options)).scheme)

    @pytest.fixture
    def connect(
        self, connect_options: dict[str, Any]
    ) -> Iterator[Callable[..., varsync.VariableContainer]]:
        """``connect(url, **more_options)``: a container, closed at teardown."""
        made: list[varsync.VariableContainer] = []

        def _connect(url: str, **more: Any) -> varsync.VariableContainer:
            container = varsync.connect(url, **{**connect_options, **more})
            made.append(container)
            return container

        yield _connect
        for container in made:
            container.close()

    @pytest.fixture
    def new_history(self) -> Callable[[str, str], None] | None:
        """``new_history(url, table)``: make the store lose the table (its data deleted, as
        a server restarted without persistence, or a store removed), so that creating it
        again starts a new history; ``None`` (the default) skips the tests that need it."""
        return None

    @pytest.fixture
    def make_tables(
        self, url: str, connect: Callable[..., Any], backend_cls: type[Backend]
    ) -> TableMaker:
        """``make({name: signature}) -> url`` with those tables created there."""

        def make(tables: Mapping[str, Any]) -> str:
            if not backend_cls.supports_create_table:
                raise NotImplementedError(
                    f"{backend_cls.__name__} cannot create tables from a client: override "
                    "the `make_tables` fixture to provide them"
                )
            container = connect(url)
            for name, signature in tables.items():
                container.create_table(name, signature)
            return url

        return make

    @pytest.fixture
    def store(
        self, make_tables: TableMaker, connect: Callable[..., Any]
    ) -> varsync.VariableContainer:
        """A container with table ``variables`` holding a small mixed nest."""
        return connect(make_tables({"variables": SMALL}))
