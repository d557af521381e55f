"""pytest plugin for the conformance suite (registered through the ``pytest11`` entry point).

It makes pytest rewrite the asserts of ``varsync.testing``, so a failing conformance test
shows the values it compared, in a third party's test run as in ours. It lives outside
``varsync.testing`` because registering must happen before that package is imported.
"""

import pytest

pytest.register_assert_rewrite("varsync.testing")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "varsync_conformance: a test of varsync's backend conformance suite"
    )
