"""varsync: publish the latest values of a nest of variables; let many readers pull them.

    import varsync
    with varsync.connect("memory://demo") as store:
        store.create_table("variables", {"w": np.zeros((2, 3), np.float32), "step": 0})
        store.push({"w": np.ones((2, 3), np.float32), "step": 1})   # -> version 1
        store.pull()                                                 # -> the nest

``import varsync`` imports no TensorFlow, Reverb or redis: backends and framework
adapters load when first used.
"""

from varsync import _plugins  # noqa: F401  (wires the plugin host into the registries)
from varsync._connect import connect
from varsync._container import DEFAULT_TABLE, TableInfo, VariableContainer
from varsync._errors import (
    AuthenticationError,
    BackendConnectionError,
    ConcurrentPushError,
    ConfigurationError,
    CorruptDataError,
    ItemTooLargeError,
    LeafPathError,
    MissingDependencyError,
    MissingSignatureError,
    PullTimeoutError,
    ShardTimeoutError,
    SignatureError,
    SignatureMismatchError,
    TableConfigurationError,
    TableExistsError,
    TableNotFoundError,
    TableResetError,
    UnknownBackendError,
    UnsupportedError,
    VarsyncError,
)
from varsync._hookspecs import hookimpl
from varsync._nest import flatten, unflatten
from varsync._registry import BackendEntry, PluginWarning, available_backends
from varsync._sharded_torch import parts_from_dtensors
from varsync._signature import Spec, signature_of

__version__ = "0.3.0"

__all__ = [
    "connect",
    "VariableContainer",
    "TableInfo",
    "DEFAULT_TABLE",
    "Spec",
    "signature_of",
    "flatten",
    "unflatten",
    "parts_from_dtensors",
    "available_backends",
    "BackendEntry",
    "PluginWarning",
    "hookimpl",
    "VarsyncError",
    "ConfigurationError",
    "UnknownBackendError",
    "MissingDependencyError",
    "TableNotFoundError",
    "TableResetError",
    "ConcurrentPushError",
    "TableExistsError",
    "TableConfigurationError",
    "MissingSignatureError",
    "SignatureError",
    "SignatureMismatchError",
    "ItemTooLargeError",
    "CorruptDataError",
    "PullTimeoutError",
    "ShardTimeoutError",
    "UnsupportedError",
    "LeafPathError",
    "BackendConnectionError",
    "AuthenticationError",
    "__version__",
]

# The public classes are varsync's: tracebacks and reprs name them ``varsync.SignatureError``,
# not the private module that defines them (pickle finds them here too).
for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type) and _value.__module__.startswith("varsync._"):
        _value.__module__ = __name__
del _name, _value
