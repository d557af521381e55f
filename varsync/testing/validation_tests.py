"""Validation: a push that does not match the signature raises and changes nothing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import varsync
from varsync.testing._base import SMALL, _Base
from varsync.testing.values import assert_bit_equal, filled

__all__ = ["ValidationTests"]


class ValidationTests(_Base):
    """A push that does not match the signature raises and changes nothing."""

    BAD_PUSHES = {
        "wrong dtype": {
            "policy": [np.ones((3, 2), np.float64), np.ones(2, np.float32)],
            "train_step": 1,
        },
        "wrong shape": {
            "policy": [np.ones((2, 3), np.float32), np.ones(2, np.float32)],
            "train_step": 1,
        },
        "missing key": {"policy": [np.ones((3, 2), np.float32), np.ones(2, np.float32)]},
        "extra key": {
            "policy": [np.ones((3, 2), np.float32), np.ones(2, np.float32)],
            "train_step": 1,
            "x": 1,
        },
        "short list": {"policy": [np.ones((3, 2), np.float32)], "train_step": 1},
        "object array": {
            "policy": [np.ones((3, 2), np.float32), np.array([None, 1], dtype=object)],
            "train_step": 1,
        },
        "ragged list": {
            "policy": [np.ones((3, 2), np.float32), [[1.0], [2.0, 3.0]]],
            "train_step": 1,
        },
        "string": {
            "policy": [np.ones((3, 2), np.float32), np.ones(2, np.float32)],
            "train_step": "1",
        },
        "float into int": {
            "policy": [np.ones((3, 2), np.float32), np.ones(2, np.float32)],
            "train_step": 1.5,
        },
        "None": {"policy": [np.ones((3, 2), np.float32), None], "train_step": 1},
    }

    @pytest.mark.parametrize("case", sorted(BAD_PUSHES))
    def test_rejected_push_leaves_the_table_unchanged(self, store: Any, case: str) -> None:
        store.push(filled(SMALL, 1))
        with pytest.raises(varsync.SignatureMismatchError) as caught:
            store.push(self.BAD_PUSHES[case])
        assert isinstance(caught.value, ValueError)
        assert store.version() == 1
        assert_bit_equal(store.pull(), filled(SMALL, 1))

    def test_mismatch_message_names_the_path_and_both_sides(self, store: Any) -> None:
        with pytest.raises(varsync.SignatureMismatchError) as caught:
            store.push(self.BAD_PUSHES["wrong dtype"])
        message = str(caught.value)
        assert "['policy'][0]" in message
        assert "float32" in message
        assert "float64" in message
