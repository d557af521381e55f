"""Deprecated: ``varsync.options`` is now ``varsync._options``, private since varsync 0.3
(removed in 0.4). Import from :mod:`varsync` (users) or :mod:`varsync.backend` (plugin
authors) instead.
"""

import warnings as _warnings

from varsync._options import *  # noqa: F403
from varsync._options import __all__  # noqa: F401

_warnings.warn(
    "varsync.options is private since varsync 0.3 (now varsync._options) and is removed in 0.4: "
    "import from varsync or varsync.backend",
    DeprecationWarning,
    stacklevel=2,
)
