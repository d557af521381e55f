"""Framework adapters: values from TensorFlow (and later others) beside the core.

The core asks :func:`adapter_for` about each leaf it does not recognise. An adapter is
imported only when a value of its framework shows up, and a framework's values can only
show up once the framework itself is imported, so ``import varsync`` imports none of them.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Dict, Optional, Protocol, Tuple

__all__ = ["Adapter", "adapter_for"]


class Adapter(Protocol):
    """What the core needs from a framework's values, variables and specs."""

    def handles(self, value: Any) -> bool:
        """True for the framework's tensors, variables and specs."""

    def shape_and_dtype(self, value: Any) -> Tuple[Tuple[int, ...], Any]:
        """The shape and numpy dtype of a value, variable or spec."""

    def to_numpy(self, value: Any) -> Any:
        """A value or variable's current contents as a numpy array (specs: ``TypeError``)."""

    def is_assignable(self, target: Any) -> bool:
        """True when ``update`` can assign into ``target`` in place."""

    def assign(self, target: Any, array: Any) -> None:
        """Assign ``array`` into the variable ``target``."""


# top-level module of the framework's types -> (framework module, adapter module)
_FRAMEWORKS: Dict[str, Tuple[str, str]] = {
    "tensorflow": ("tensorflow", "varsync.adapters.tensorflow"),
    "keras": ("tensorflow", "varsync.adapters.tensorflow"),
    "tf_keras": ("tensorflow", "varsync.adapters.tensorflow"),
}
_LOADED: Dict[str, Adapter] = {}


def adapter_for(value: Any) -> Optional[Adapter]:
    """The adapter for ``value``'s framework, or ``None`` for anything else."""
    top = type(value).__module__.partition(".")[0]
    framework = _FRAMEWORKS.get(top)
    if framework is None or framework[0] not in sys.modules:
        return None
    module_name = framework[1]
    adapter = _LOADED.get(module_name)
    if adapter is None:
        adapter = importlib.import_module(module_name).ADAPTER
        _LOADED[module_name] = adapter
    return adapter if adapter.handles(value) else None
