"""Tools run from the repository's root with ``python -m tools.<name>``: ``tools.soak``."""
