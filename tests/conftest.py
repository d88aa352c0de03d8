"""Suite-wide settings: which tests run together on one worker, and the quick subset.

The suite runs on two pytest-xdist workers (``-n 2 --dist loadgroup`` in pyproject.toml). A
multi-rank test file is one group, kept on one worker: its jobs shared between tests
(``harness.shared_script``) and its module fixtures (a Spark or Ray cluster) exist once per
worker. The files that build the two network-namespace hosts share one group, because the hosts'
names and addresses are fixed. The GPU tests are one group: there is one GPU. In-process unit
tests go to whichever worker is free, so they run while the other worker's ranks wait.

``pytest -m quick`` is the inner loop: every unit test and the multi-rank tests marked ``quick``
(one job per framework and the core collectives), about 3 minutes on 2 cores.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent
NETNS_FILES = {"test_multihost.py", "test_elastic_multihost.py", "test_slurm.py"}


def worker_group(path: Path) -> str | None:
    """The xdist group of a test file, or None for a test any worker may take alone."""
    folder = path.parent.name
    if folder == "gpu":
        return "gpu"
    if folder != "multirank":
        return None
    return "netns" if path.name in NETNS_FILES else path.stem


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        group = worker_group(path)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        if path.parent.name == "unit":
            item.add_marker(pytest.mark.quick)
