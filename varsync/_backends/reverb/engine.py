"""Reverb and TensorFlow, imported once for the package (or the extra to install named),
and the one place their exceptions become varsync's."""

from __future__ import annotations

from contextlib import AbstractContextManager

try:
    import reverb
    import tensorflow as tf
    from reverb.cc import schema_pb2
    from reverb.cc.ops import gen_reverb_ops
    from tensorflow.python.saved_model import nested_structure_coder
except ImportError as exc:  # pragma: no cover - exercised where the extra is missing
    from varsync.backend import MissingDependencyError

    raise MissingDependencyError(
        f"the reverb:// backend needs dm-reverb and TensorFlow ({exc.name} is missing); "
        'install them with: pip install "varsync[reverb]" (Linux x86-64, Python 3.11)'
    ) from exc

from varsync.backend import BackendConnectionError, ErrorMap, translate_errors, translated_error

__all__ = [
    "reverb",
    "tf",
    "schema_pb2",
    "gen_reverb_ops",
    "nested_structure_coder",
    "translated",
    "DRIVER_ERRORS",
    "translation",
]

#: What Reverb's client (pybind: RuntimeError; ops: tf.errors.OpError) raises when the
#: server is gone, slow (deadline exceeded) or failing: all of it is a connection error.
_ERRORS: ErrorMap = {
    reverb.errors.ReverbError: BackendConnectionError,
    tf.errors.OpError: BackendConnectionError,
    RuntimeError: BackendConnectionError,
}


#: What :func:`translated` turns into :class:`~varsync.BackendConnectionError`.
DRIVER_ERRORS = tuple(_ERRORS)


def translated(address: str, doing: str) -> AbstractContextManager[None]:
    """Reverb's exceptions inside as :class:`~varsync.BackendConnectionError`, naming the
    server's ``address`` and what the client was ``doing``."""
    return translate_errors(_ERRORS, _where(address, doing))


def translation(address: str, doing: str, exc: BaseException) -> BaseException:
    """What :func:`translated` raises for ``exc``, for a request made often enough that
    its caller catches :data:`DRIVER_ERRORS` itself (see ``translated_error``)."""
    return translated_error(_ERRORS, _where(address, doing), exc)


def _where(address: str, doing: str) -> str:
    return f"Reverb server at {address} ({doing})"
