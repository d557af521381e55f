"""varsync's benchmark harness, run from the repository's root as a package:
``python -m benchmarks.suite`` (``make bench``; ``--smoke`` in ``make test``). How it works
and how to read it: docs/benchmarks.md."""
