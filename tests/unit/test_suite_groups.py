"""The suite's xdist groups take effect (tests/conftest.py): each test's id carries its group.

pytest-xdist's ``--dist loadgroup`` appends the group to a test's id, and schedules by that suffix.
On pytest 9 the id lives elsewhere and the suffix is silently lost: every file's tests were spread
over both workers and each worker ran a file's shared jobs again.
"""

import os

import pytest


def test_a_unit_test_runs_in_the_unit_group(request: pytest.FixtureRequest):
    if not (os.environ.get("PYTEST_XDIST_WORKER") and request.config.getoption("loadgroup", False)):
        pytest.skip("not under pytest-xdist's --dist loadgroup (pytest -n 0, or -p no:xdist)")
    assert request.node.nodeid.endswith("@unit"), request.node.nodeid
