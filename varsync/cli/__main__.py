"""``python -m varsync.cli``: the ``varsync`` command."""

import sys

from varsync.cli import main

sys.exit(main())
