"""Tables: creation, listing, info, and errors that name the tables there are."""

from __future__ import annotations

from typing import Any, Type

import numpy as np
import pytest

import varsync
from varsync.backends.base import Backend
from varsync.testing._base import SMALL, TableMaker, _Base
from varsync.testing.values import assert_bit_equal, filled

__all__ = ["TableTests"]


class TableTests(_Base):
    """Tables: creation, listing, info, unknown names."""

    def test_created_table_is_listed_with_its_signature(self, store: Any) -> None:
        assert "variables" in store.tables()
        info = store.table_info("variables")
        assert info.name == "variables"
        assert info.version == 0
        assert info.nbytes == 3 * 2 * 4 + 2 * 4 + 8
        assert varsync.flatten(info.signature) == varsync.flatten(SMALL)

    @pytest.fixture
    def created_by_client(self, url: str, connect: Any, backend_cls: Type[Backend]) -> Any:
        """A container with table ``t`` created by ``create_table`` (skips where clients
        cannot create tables)."""
        if not backend_cls.supports_create_table:
            pytest.skip("backend cannot create tables from a client")
        container = connect(url)
        container.create_table("t", SMALL)
        return container

    def test_create_table_again_with_same_signature_is_a_no_op(
        self, url: str, connect: Any, created_by_client: Any
    ) -> None:
        container = created_by_client
        container.push(filled(SMALL, 3), table="t")
        again = connect(url).create_table("t", {"train_step": np.int64(0), "policy": (
            np.zeros((3, 2), np.float32), np.zeros(2, np.float32))})
        assert varsync.flatten(again) == varsync.flatten(SMALL)
        assert container.version("t") == 1

    def test_create_table_with_another_signature_is_refused(
        self, url: str, connect: Any, created_by_client: Any
    ) -> None:
        container = created_by_client
        container.push(filled(SMALL, 5), table="t")
        with pytest.raises(varsync.TableExistsError):
            connect(url).create_table("t", {"train_step": varsync.Spec((), "int32")})
        assert container.version("t") == 1
        assert_bit_equal(connect(url).pull("t"), filled(SMALL, 5))

    def test_unknown_table_raises_key_error_naming_existing_tables(self, store: Any) -> None:
        for call in (
            lambda: store.pull("missing", timeout=1),
            lambda: store.push(filled(SMALL, 1), table="missing"),
            lambda: store.version("missing"),
            lambda: store.pull_if_newer(0, "missing"),
            lambda: store.table_info("missing"),
        ):
            with pytest.raises(varsync.TableNotFoundError) as caught:
                call()
            assert isinstance(caught.value, KeyError)
            assert "missing" in str(caught.value) and "variables" in str(caught.value)

    def test_tables_are_independent(self, make_tables: TableMaker, connect: Any) -> None:
        container = connect(make_tables({"a": SMALL, "b": {"x": varsync.Spec((4,), "int32")}}))
        assert container.push(filled(SMALL, 1), table="a") == 1
        assert container.push(filled(SMALL, 2), table="a") == 2
        assert container.version("b") == 0
        assert container.push({"x": np.arange(4, dtype=np.int32)}, table="b") == 1
        assert container.version("a") == 2
        assert_bit_equal(container.pull("a"), filled(SMALL, 2))
        assert_bit_equal(container.pull("b"), {"x": np.arange(4, dtype=np.int32)})
