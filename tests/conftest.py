"""Suite-wide settings: the quick subset, and where the suite's cores go.

``pytest -m quick`` is the inner loop: every unit test and the multi-rank tests marked ``quick``
(every collective through every framework at np=2 and np=3, and torch training against one
process), about a minute and a half on 2 cores.

``HVDLITE_TEST_CPU_LOG=path`` appends, per test, its wall seconds and the CPU seconds of the
processes it started and waited for (the ranks of its jobs; a job shared by several tests counts
for the first): where the suite's time goes. The suite runs one test at a time: it is CPU-bound
(measured: two pytest-xdist workers on 2 cores took 22.2 minutes against 23.4 serial, with
23 % more CPU and tests that read machine-wide state, such as /dev/shm, failing).
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).parent.name == "unit":
            item.add_marker(pytest.mark.quick)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    log = os.environ.get("HVDLITE_TEST_CPU_LOG")
    if not log:
        return (yield)
    started, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        return (yield)
    finally:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        with open(log, "a") as out:
            out.write(f"{time.monotonic() - started:.2f} {cpu:.2f} {item.nodeid}\n")
