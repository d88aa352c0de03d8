"""Process sets with real ranks at np=3 and np=4 (oversubscribed): every collective on overlapping and
disjoint sets, static and dynamic registration, bad sets failing on every rank, and a set that never
waits for a rank outside it."""

import re

import pytest

from .harness import run_script, shared_script

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("case", ["static", "dynamic"])
@pytest.mark.parametrize("np", [3, 4])
def test_every_collective_on_overlapping_and_disjoint_sets(np, case):
    result = shared_script("process_sets.py", np, case, timeout=180)  # np=3 static: also the next test's
    assert result.returncode == 0, result.output
    for rank in range(np):
        assert f"ok {case}" in result.lines(rank), result.output


def test_a_rank_outside_a_set_gets_an_error_at_once():
    result = shared_script("process_sets.py", 3, "static", timeout=180)
    assert result.returncode == 0, result.output
    # np=3 sets: [0, 2] (id 1), [0, 1] (id 2), [1] (id 3)
    assert any("rank 1 is not in process set 1 [0, 2]" in line for line in result.lines(1)), result.output
    assert any("rank 2 is not in process set 2 [0, 1]" in line for line in result.lines(2)), result.output


@pytest.mark.parametrize("np", [3, 4])
def test_sets_from_mpi4py_communicators(np):
    result = run_script("process_sets.py", np, "from_comm", timeout=120)
    for rank in range(np):
        assert "ok from_comm" in result.lines(rank), result.output


@pytest.mark.parametrize("np", [2, 3])
def test_bad_sets_fail_on_every_rank_and_the_job_goes_on(np):
    result = run_script("process_sets.py", np, "bad_sets", timeout=120)
    for rank in range(np):
        lines = result.lines(rank)
        assert "ok bad_sets" in lines, result.output
        assert sum(line.startswith("caught ProcessSetError") for line in lines) >= 7, result.output


@pytest.mark.parametrize("case", ["not_dynamic", "second_init"])
def test_adding_a_set_without_dynamic_mode_or_by_a_repeated_init_is_refused(case):
    result = shared_script("process_sets.py", 3, "not_dynamic,second_init", timeout=60)
    for rank in range(3):
        assert f"ok {case}" in result.lines(rank), result.output


def test_a_set_keeps_reducing_while_a_rank_outside_it_sleeps():
    result = run_script("process_sets.py", 3, "concurrent", timeout=120)
    for rank in (0, 1):
        seconds = [float(m.group(1)) for line in result.lines(rank) if (m := re.match(r"pair seconds (\S+)", line))]
        # 200 small allreduces take well under a second here; rank 2 sleeps 6 s. Waiting for it would show.
        assert seconds and seconds[0] < 4.0, result.output


@pytest.mark.parametrize("np", [3, 4])
def test_torch_trains_two_data_parallel_sets_like_one_process_each(np):
    result = run_script("torch_process_sets.py", np, timeout=240)
    for rank in range(np):
        assert "ok torch process sets" in result.lines(rank), result.output


@pytest.mark.parametrize(("np", "mode"), [(3, "static"), (2, "dynamic")])
def test_tensorflow_and_keras_train_two_data_parallel_sets_like_one_process_each(np, mode, tensorflow_job):
    result = tensorflow_job(np)  # the TensorFlow job that several files share (tensorflow_job.py)
    for rank in range(np):
        assert f"ok tf process sets {mode}" in result.lines(rank), result.output


def test_stalls_mismatches_and_the_timeline_name_the_set_and_ranks_of_the_job(tmp_path):
    timeline = tmp_path / "timeline.json"
    result = run_script("process_sets.py", 3, "reports", timeout=120,
                        env={"HVDLITE_STALL_CHECK_TIME_SECONDS": "1", "HVDLITE_TIMELINE": str(timeline)})
    # the set [0, 2] is process set 1; its second member is job rank 2 (rank 1 of the set)
    assert "in process set 1 [0, 2] waited" in result.output and "missing on rank(s) [2]" in result.output, \
        result.output
    for rank in (0, 2):
        assert any(line == "mismatch: Mismatched shape for allreduce of tensor 'ps.shape': rank 0: (1,), "
                   "rank 2: (3,) in process set 1 [0, 2]" for line in result.lines(rank)), result.output
    rows = next(line for line in result.lines(0) if line.startswith("timeline rows:"))
    assert "'process set 1: allreduce.ps.late'" in rows, rows


JAX_IN_AND_OUT_OF_JIT = ["allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "alltoall",
                         "reducescatter", "grouped_reducescatter"]
JAX_HOST_ONLY = ["alltoall_splits", "barrier", "join", "broadcast_parameters", "broadcast_optimizer_state",
                 "broadcast_object", "allgather_object"]


# np=3 only: the sets' bookkeeping is the core's, run at np=3 and 4 by the collectives and torch tests above.
@pytest.mark.parametrize("mode", ["static", "dynamic"])
@pytest.mark.parametrize("np", [3])
def test_jax_collectives_and_optax_train_on_overlapping_and_disjoint_sets(np, mode):
    """Every JAX collective outside and inside jit on each set a rank is in; two optax groups (evens,
    odds) each equal to one process on the group's whole batch; and, on each set a rank is not in,
    the core's ProcessSetError from every call at once (inside jit: while tracing)."""
    result = shared_script("jax_process_sets.py", np, "static,dynamic", timeout=400)  # one job for both modes
    assert result.returncode == 0, result.output
    sets = [list(range(0, np, 2)), list(range(1, np, 2)), [0, 1] if np == 3 else [0, 1, 2]]  # ids 1, 2, 3
    refused = re.compile(r"caught ProcessSetError (eager|jit) (\w+): .* rank (\d+) is not in process set "
                         r"(\d+) (\[.*?\])")
    for rank in range(np):
        lines = result.lines(rank)
        assert f"ok jax process sets {mode}" in lines, result.output
        caught = {(m.group(1), m.group(2), int(m.group(4)), m.group(5)) for line in lines
                  if (m := refused.match(line)) and int(m.group(3)) == rank}
        outside = [(set_id, str(ranks)) for set_id, ranks in enumerate(sets, 1) if rank not in ranks]
        calls = [("eager", kind) for kind in JAX_IN_AND_OUT_OF_JIT + JAX_HOST_ONLY] + \
            [("jit", kind) for kind in JAX_IN_AND_OUT_OF_JIT]
        expected = {(where, kind, set_id, ranks) for set_id, ranks in outside for where, kind in calls}
        assert caught == expected, result.output
