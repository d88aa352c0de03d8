"""Every collective, dtype, async handle and init/shutdown cycle, at np=2 and np=3 (oversubscribed),
through the core (NumPy) and through each framework adapter."""

import pytest

from .harness import JobResult, run_script, shared_script
from .jax_job import COLLECTIVES as JAX_COLLECTIVES
from .tensorflow_job import COLLECTIVES

pytestmark = pytest.mark.multirank
CHECKS = ["test_topology", "test_allreduce", "test_fp16_exact", "test_grouped_and_fusion", "test_allgather",
          "test_broadcast", "test_alltoall", "test_reducescatter", "test_objects_and_barrier", "test_join_then_objects"]


# NumPy and torch in a job each; the eager and compiled forms of TensorFlow and JAX in the jobs of
# their framework that several files share (tensorflow_job.py, jax_job.py): one framework start a rank.
JOBS = {"numpy": "numpy", "torch": "torch"}
# The quick subset (pytest -m quick) runs those shared jobs at np=2 only: each runs every script of its files.
QUICK_AT_NP_2 = [pytest.param(2, marks=pytest.mark.quick), 3]


@pytest.mark.quick
@pytest.mark.parametrize("framework", list(JOBS))
@pytest.mark.parametrize("np", [2, 3])
def test_every_collective(np, framework):
    _check_every_collective(shared_script("collectives.py", np, JOBS[framework]), None, framework, np)


@pytest.mark.parametrize("framework", ["tensorflow", "tensorflow-graph"])
@pytest.mark.parametrize("np", QUICK_AT_NP_2)
def test_every_collective_through_tensorflow(np, framework, tensorflow_job):
    _check_every_collective(tensorflow_job(np), COLLECTIVES, framework, np)


@pytest.mark.parametrize("framework", ["jax", "jax-jit"])
@pytest.mark.parametrize("np", QUICK_AT_NP_2)
def test_every_collective_through_jax(np, framework, jax_job):
    _check_every_collective(jax_job(np), JAX_COLLECTIVES, framework, np)


def _check_every_collective(result: JobResult, command: str | None, framework: str, np: int) -> None:
    """Every rank printed each check's line for ``framework``, in order (of ``command`` in a shared job)."""
    for rank in range(np):
        lines = result.lines(rank) if command is None else result.command_lines(rank, command)
        done = [x for x in lines if x.startswith(f"ok {framework} ")]
        assert done == [f"ok {framework} {name}" for name in CHECKS + ["reinit"]], result.output


@pytest.mark.parametrize("np", [2, 3])
def test_join_counts_joined_ranks_as_zeros(np):
    result = run_script("failures.py", np, "join")
    for rank in range(np):
        assert f"join returned {np - 1}" in result.lines(rank)


@pytest.mark.parametrize("np", [2, 3])
def test_under_join_every_other_collective_fails_at_once_on_every_waiting_rank(np):
    result = run_script("failures.py", np, "join_others", timeout=90)
    for rank in range(np - 1):
        caught = [x for x in result.lines(rank) if x.startswith("caught UnsupportedOperationError")]
        assert len(caught) == 4, result.output
    returned = {x for rank in range(np) for x in result.lines(rank) if x.startswith("join returned")}
    # every rank names the same last joiner, one of those that were still reducing
    assert len(returned) == 1 and int(returned.pop().split()[-1]) in range(np - 1), result.output


def test_init_on_a_subset_of_ranks():
    result = run_script("failures.py", 3, "subset")
    assert any("caught HvdliteError: rank 2 called init(comm=[0, 1])" in line for line in result.lines(2)), result.output
    for rank in range(2):
        assert "rank - done" in result.lines(rank)
