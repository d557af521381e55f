"""A drop-in for TF-Agents' ``ReverbVariableContainer``: change one import.

    # from tf_agents.experimental.distributed.reverb_variable_container import (
    #     ReverbVariableContainer, TRAIN_STEP_KEY, POLICY_KEY)
    from varsync.compat.tf_agents import ReverbVariableContainer, TRAIN_STEP_KEY, POLICY_KEY

Same constructor, methods, return types and exceptions as TF-Agents 0.19's class, over
varsync's Reverb backend (so pushes are faster, and tables stay interchangeable). Two
differences, both deliberate: a pull of an empty table, or a call to a server that does
not answer, raises after ``timeout`` seconds (default 30; ``None`` waits forever, as
TF-Agents did) instead of hanging; and a server address that nothing listens on fails at
construction. ``container`` gives the full varsync API (versions, ``pull_if_newer``,
``wait_for``) on the same connection.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import numpy as np
import tensorflow as tf

import varsync
from varsync.config import DEFAULT_TIMEOUT
from varsync.errors import SignatureMismatchError

__all__ = ["ReverbVariableContainer", "DEFAULT_TABLE", "TRAIN_STEP_KEY", "POLICY_KEY"]

DEFAULT_TABLE = "variables"
TRAIN_STEP_KEY = "train_step"
POLICY_KEY = "policy_variables"


class ReverbVariableContainer:
    """Pushes and pulls nests of variables through tables of a Reverb server.

    Raises at construction, as TF-Agents does: ``KeyError`` if a listed table does not
    exist, ``TypeError`` if it has no signature, ``ValueError`` if its ``max_size`` is
    not 1 (varsync's errors subclass these).
    """

    def __init__(
        self,
        server_address: str,
        table_names: Iterable[str] = (DEFAULT_TABLE,),
        *,
        timeout: Optional[float] = DEFAULT_TIMEOUT,
    ) -> None:
        url = server_address if "://" in server_address else f"reverb://{server_address}"
        self.container = varsync.connect(url, timeout=timeout)
        self._signatures = {}
        try:
            for table in table_names:
                self._signatures[table] = self.container.signature(table)
        except BaseException:
            self.container.close()
            raise

    def push(self, values: Any, table: str = DEFAULT_TABLE) -> None:
        """Pushes a nest of tensors, variables or arrays into ``table``.

        ``KeyError`` for a table not given at construction;
        ``tf.errors.InvalidArgumentError`` when the nest's structure (sequence types
        aside) or dtypes differ from the table's signature.
        """
        self._check_table(table)
        try:
            self.container.push(values, table)
        except SignatureMismatchError as exc:
            raise tf.errors.InvalidArgumentError(None, None, str(exc)) from exc

    def pull(self, table: str = DEFAULT_TABLE) -> Any:
        """Pulls ``table``'s value as a nest of tensors shaped like its signature."""
        self._check_table(table)
        return tf.nest.map_structure(_to_tensor, self.container.pull(table))

    def update(self, variables: Any, table: str = DEFAULT_TABLE) -> None:
        """Pulls ``table`` and assigns the values into ``variables`` (``tf.Variable``s).

        ``KeyError`` for an unknown table; ``ValueError`` when the variables' structure
        or dtypes do not match.
        """
        self._check_table(table)
        self.container.update(variables, table)

    def _check_table(self, table: str) -> None:
        if table not in self._signatures:
            raise KeyError(
                f"Could not find the table {table}. Available tables: "
                f"{list(self._signatures)}"
            )


#: Below this size a copy costs less than the checks that avoid it.
_ALIAS_FROM_BYTES = 1 << 16


def _to_tensor(array: np.ndarray) -> Any:
    """A pulled array as a tensor; without a copy when its memory allows it.

    ``tf.convert_to_tensor`` always copies. A large, writable, C-contiguous array whose
    memory is 64-byte aligned (what TensorFlow requires of a tensor's buffer; the Reverb
    backend's pulls are views of tensors, so theirs always is) is handed over through
    DLPack instead, and the tensor keeps the array alive. The pulled arrays belong to
    this call alone, so nothing else sees the shared memory.
    """
    if (
        array.nbytes >= _ALIAS_FROM_BYTES
        and array.flags.writeable
        and array.flags.c_contiguous
        and array.ctypes.data % 64 == 0
    ):
        try:
            return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
        except Exception:  # a dtype DLPack does not carry: copy it instead
            pass
    return tf.convert_to_tensor(array)
