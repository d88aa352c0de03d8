"""Suite-wide settings: the quick subset, and where the suite's cores go.

``pytest -m quick`` is the inner loop: every unit test and the multi-rank tests marked ``quick``
(every collective through every framework at np=2 and np=3, and torch training against one
process), about a minute and a half on 2 cores.

``HVDLITE_TEST_CPU_LOG=path`` appends, per test, its wall seconds and the CPU seconds of the
processes it started and waited for (the ranks of its jobs; a job shared by several tests counts
for the first): where the suite's time goes.

Two pytest-xdist workers (``-n 2 --dist loadgroup``, in pyproject's addopts): one runs the tests
that start ranks, one test at a time, the other the in-process unit tests beside them. Multi-rank
tests are not run two at a time: the suite is CPU-bound and they read machine-wide state such as
/dev/shm (measured: two workers sharing the multi-rank files took 22.2 minutes against 23.4 serial,
with 23 % more CPU and such tests failing); the unit tests use one core for about a minute and a
half and read nothing of the kind. The Slurm test that waits out a job's time limit (Slurm ends a
job 60 to 90 s after it started) runs last, so the job runs beside everything after the Slurm file.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

LAST = "test_slurm.py::test_a_time_limit_ends_the_job_on_both_nodes_with_the_reason"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        unit = Path(str(item.fspath)).parent.name == "unit"
        item.add_marker(pytest.mark.xdist_group("unit" if unit else "ranks"))
        if unit:
            item.add_marker(pytest.mark.quick)
    items.sort(key=lambda item: item.nodeid.endswith(LAST))  # stable: only that test moves, to the end


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
