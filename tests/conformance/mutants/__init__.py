"""A small, correct third-party backend (``reference``) and broken variants of it
(``broken``), registered through ``plugin`` for the mutation tests of the conformance
suite (tests/conformance/test_suite_catches_broken_backends.py)."""
