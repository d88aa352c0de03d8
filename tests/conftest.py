"""Suite-wide settings: the quick subset, and where the suite's cores go.

``pytest -m quick`` is the inner loop: every unit test and the multi-rank tests marked ``quick``
(every collective through NumPy and torch at np=2 and np=3, through TensorFlow and JAX at np=2 in
their shared jobs, and torch training against one process), about two and a half minutes on 2 cores.

``HVDLITE_TEST_CPU_LOG=path`` appends, per test, its wall seconds and the CPU seconds of the
processes it started and waited for (the ranks of its jobs; a job shared by several tests counts
for the first), then its xdist worker and the time it ended: where the suite's time goes.

Two pytest-xdist workers (``-n 2 --dist loadgroup --no-loadscope-reorder``, in pyproject's addopts),
each taking whole groups: a multi-rank file is a group (its shared jobs run once, on one worker), the
files that use the network-namespace hosts are one group (they use the same namespaces), the tests of
other files that check the shared TensorFlow or JAX job (the ``tensorflow_job`` and ``jax_job``
fixtures) join test_tensorflow's or test_jax's, the unit tests are one. Groups go out in the order this file sorts them (longest
first; xdist would otherwise order them by their number of tests). Measured on 2 cores, fresh clone,
2026-12-01: 46:10 of tests (51:53 with the install), and 2026-12-02 48:40 (53:05), then 55:18 (about 61:00) with the
trainers' tests and the Lightning estimator, on days the machine ran 3-4x slower
(bench/torch_backend.py's gloo 4 B call: 400-490 us against 163 us on 11-28); a941ddf's own
timing bounds failed that day too. 2026-11-29: 17:25 and 18:37 of tests (19:25, 20:35 with the install) once test_torch, test_diloco and
the FSDP2 example shared their torch jobs and three files the TensorFlow job; 20:20 (22:28) an hour
before with only the TensorFlow one, in a slow hour for this machine (its speed drifts by 10-15%); 18:53
to 19:35 (20:52 to 21:29) earlier that day before either; 21:31 without the shared JAX compilation
cache, 29:34 before the Spark JVMs' settings, 40:43 before small scripts shared jobs through
scripts/together.py. 2026-12-03: 21:37 to 22:20 of tests, then 18:55 and 20:46 (a slower hour: the unit
tests alone took 125 s instead of 107) once Lightning's three kinds, more TensorFlow scripts, a JAX job
and the checkpoints across sizes shared jobs, and MPICH slept in its blocking waits; 19:07 (run started
at 16:57) once hvdliterun no longer imported the core (0.08 CPU s a job instead of 0.27); 19:15 (18:57) with ml_dtypes
0.6.0 pinned and 19:33 (19:35), 19:50 (20:02) installed with --no-compile (1:11 from the clone to the first test instead of 1:44). The cores are the limit, not the workers: most of a small job's CPU is its ranks
importing their framework, so scripts that need nothing of their own from the launcher share one job per
size. Two jobs at a time oversubscribe the cores, so no test bounds a time tighter than its generous
margin, and tests that look at machine-wide state (MPICH's files in /dev/shm) tell their job's from a
running neighbour's. The Slurm test that waits out a job's time limit (Slurm ends a job 60 to 90 s after
it started) runs last of its worker, so the job runs beside the tests after it instead of being waited
for.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# Every rank imports hvdlite, its test script's helpers and the launcher afresh. Where the environment
# sets PYTHONDONTWRITEBYTECODE (some containers do), each of those processes compiles them again:
# about 0.2 s of CPU per process, thousands of processes a run. The suite lets Python keep its
# bytecode (in __pycache__, which git ignores) for itself and every process it starts.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

LAST = "test_slurm.py::test_a_time_limit_ends_the_job_on_both_nodes_with_the_reason"
# The longest groups first (worker seconds, measured on a fresh clone on 2026-12-02, 2 cores, both
# workers busy, in a slow hour: spark 841, diloco 372, the namespace files 309, elastic 265, trainers
# 260, torch_backend 248, fully_sharded 243, tensorflow 193, adasum 151, collectives 144, jax 139,
# fully_sharded_torch_apis 133, elastic_frameworks 126, ray 105, process_sets 101, torch 98,
# gpu_scripts_on_cpu 81, elastic_examples 69, shm 55, docs 38; the unit tests 141, in many short
# items, go last with the failure tests), so that neither worker is left with a long file while the
# other has finished (xdist keeps one group queued per worker): the rest follow in file order.
LONGEST_FIRST = ["test_spark", "test_diloco", "netns", "test_elastic", "test_trainers", "test_torch_backend",
                 "test_fully_sharded", "test_tensorflow", "test_adasum", "test_collectives", "test_jax",
                 "test_fully_sharded_torch_apis", "test_elastic_frameworks", "test_ray", "test_process_sets",
                 "test_torch", "test_gpu_scripts_on_cpu", "test_elastic_examples", "test_shm", "test_docs", "unit",
                 "test_failures"]


def _group(item: pytest.Item) -> str:
    path = Path(str(item.fspath))
    if path.parent.name == "unit":
        return "unit"
    if path.stem == "test_spark_estimators" or path.stem.startswith("test_horovod_spark"):
        return "test_spark"  # one Spark session (tests/multirank/conftest.py) for the Spark files
    if "tensorflow_job" in getattr(item, "fixturenames", ()):
        return "test_tensorflow"  # the worker that runs the shared TensorFlow job (tests/multirank/tensorflow_job.py)
    if "jax_job" in getattr(item, "fixturenames", ()):
        return "test_jax"  # the worker that runs the shared JAX job (tests/multirank/jax_job.py)
    return "netns" if item.get_closest_marker("netns") else path.stem


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item)))
        if _group(item) == "unit":
            item.add_marker(pytest.mark.quick)
    def order(item: pytest.Item) -> tuple[int, bool]:
        group = _group(item)
        return (LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST),
                item.nodeid.endswith(LAST))
    items.sort(key=order)  # stable: within a group, file order (the time-limit test last)


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
            worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
            out.write(f"{time.monotonic() - started:.2f} {cpu:.2f} {item.nodeid} {worker} {time.time():.1f}\n")
