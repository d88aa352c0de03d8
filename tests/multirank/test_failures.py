"""Error behaviour with real ranks: every rank gets a clear error, in bounded time, nothing hangs."""

import re
import time

import pytest
from hvdlite.runner.leftovers import mapped, segments

from .harness import run_script, run_scripts_together

pytestmark = pytest.mark.multirank
FAST_STALL = {"HVDLITE_STALL_CHECK_TIME_SECONDS": "1", "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "3"}


@pytest.mark.parametrize("np", [2, 3])
def test_mismatches_name_tensor_and_every_rank_value(np):
    result = run_script("failures.py", np, "mismatch")
    others = ", ".join(f"rank {r}: (3, 2)" for r in range(1, np))
    others_dtype = ", ".join(f"rank {r}: float64" for r in range(1, np))
    for rank in range(np):
        lines = result.lines(rank)
        assert f"caught TensorMismatchError: Mismatched shape for allreduce of tensor 'w.shape': rank 0: (2, 3), {others}" in lines
        assert f"caught TensorMismatchError: Mismatched dtype for allreduce of tensor 'w.dtype': rank 0: float32, {others_dtype}" in lines
        assert any("Mismatched op for allreduce of tensor 'w.op': rank 0: SUM, rank 1: MAX" in x for x in lines)
        assert any("Mismatched prescale for allreduce of tensor 'w.prescale': rank 0: 1.0, rank 1: 0.5" in x for x in lines)
        assert any("Mismatched root_rank for broadcast of tensor 'w.root': rank 0: 0, rank 1: 1" in x for x in lines)
        assert any("for allgather of tensor 'w.gather'" in x for x in lines)
        assert "job continues" in lines


def test_local_argument_errors():
    result = run_script("failures.py", 2, "duplicate")
    for rank in range(2):
        lines = result.lines(rank)
        assert f"caught DuplicateNameError: tensor name(s) ['dup'] already in flight on rank {rank}; wait for the earlier operation or give each operation a unique name" in lines
        assert "caught UnsupportedOperationError: broadcast of tensor 'badroot': root_rank=2 is not in [0, 2)" in lines
        assert any("has dtype str32, which hvdlite does not support" in x for x in lines)
        assert "job continues" in lines


@pytest.mark.parametrize("np", [2, 3])
def test_unnamed_collectives_keep_one_sequence_and_divergence_is_an_immediate_error(np):
    result = run_script("failures.py", np, "unnamed_sequence", timeout=60)
    for rank in range(np):
        assert "unnamed sequence ok" in result.lines(rank), result.output


def test_peer_shutdown_fails_waiting_rank_at_once():
    result = run_script("failures.py", 2, "shutdown_peer", timeout=30)
    assert ("caught HvdliteShutdownError: tensor 'after.peer.shutdown' can never complete: rank(s) [1] "
            "called shutdown() without submitting it") in result.lines(0)


@pytest.mark.parametrize("np", [2, 3])
def test_uncaught_exception_ends_the_job_with_traceback(np):
    result = run_script("failures.py", np, "uncaught", timeout=60, expect_ok=False)
    assert result.returncode != 0
    lines = result.lines(1)
    assert "RuntimeError: boom from the user's training loop" in lines and "Traceback (most recent call last):" in lines
    assert "hvdlite: rank 1 failed with an uncaught RuntimeError; aborting all ranks" in lines
    assert result.seconds < 30


def _lasting_leftovers(before: set[str], patience: float = 20.0) -> set[str]:
    """New /dev/shm files that no live process maps and that do not go away within ``patience`` s.

    Another file's job runs beside this one (xdist): its files are mapped while its ranks run, and
    between its ranks' exit and its hvdliterun's clean-up (moments later) they are neither; they go.
    """
    deadline = time.monotonic() + patience
    while True:
        left = (segments() - before) - mapped()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


@pytest.mark.parametrize("np", [2, 3])
def test_killed_rank_ends_the_job_and_is_named(np):
    before = segments()
    result = run_script("failures.py", np, "killed", timeout=60, expect_ok=False)
    assert result.returncode != 0
    # MPICH's shared-memory files the killed job's ranks left (2 MiB and up each): hvdliterun removes them.
    assert not _lasting_leftovers(before), result.output
    # On a busy machine hvdliterun's watcher may look only after MPI has killed the others too (it then
    # says which ones it saw gone), or not before mpiexec ends at all. Then it quotes MPI's report with
    # the caveat that MPI may name a rank it killed itself (seen in CI: MPI reported rank 0), instead
    # of claiming an order it did not see.
    caveat = r"terminated abnormally \(it may name a rank it killed while cleaning up"
    named = (r"hvdliterun: rank 1 \(pid \d+\) was the first rank to end; the job failed",
             r"hvdliterun: ranks \[[\d, ]+\] ended before hvdliterun could tell them apart; MPI reports rank \d "
             r"\(pid \d+\) " + caveat,
             r"hvdliterun: MPI reports rank \d \(pid \d+ on \S+\) " + caveat)
    assert any(re.search(pattern, result.output) for pattern in named), result.output
    assert result.seconds < 30


# The tests below wait on deadlines (stall warnings, silent ranks) and use little CPU: their jobs run
# together, once, for the first of them (they come after the killed-rank test, which counts MPICH's
# shared-memory files). Each test checks its own job.
SILENCE_TIMEOUT, LATE_TIMEOUT = 3, 4
# Nine jobs (25 processes) start together on two cores: their start-up alone took 25-30 s on a slow
# day (2026-12-01), so a job's seconds bound the failure handling only with this room; a deadline
# that did not end the job would run into the jobs' 90 s limit.
TOGETHER_START = 30
SILENT_CASES = [(2, "1024"), (3, "1024"), (2, str(16 << 20)), (3, str(16 << 20))]


@pytest.fixture(scope="module")
def waiting_jobs():
    jobs = {(case, np): ("failures.py", np, (case,), FAST_STALL) for case in ("stall", "cached_stall") for np in (2, 3)}
    for np, floats in SILENT_CASES:
        # SIGSTOP: the process lives but never takes part again, as a host behind a dead link looks.
        # 64 MB steps: it stops inside a shared-memory reduction, with peers at its barriers.
        jobs["silent", np, floats] = ("multihost.py", np, ("die", "1", "stop", floats),
                                      {"HVDLITE_COMM_TIMEOUT_SECONDS": str(SILENCE_TIMEOUT)})
    # Rank 1 stops for good; rank 2 is paused for 3 s before the same step (see the test).
    jobs["late"] = ("multihost.py", 3, ("die", "1", "stop", "1024", "3"), {"HVDLITE_COMM_TIMEOUT_SECONDS": str(LATE_TIMEOUT)})
    return run_scripts_together(jobs, timeout=90)


@pytest.mark.parametrize("case", ["stall", "cached_stall"])
@pytest.mark.parametrize("np", [2, 3])
def test_stall_warns_then_fails_every_rank(waiting_jobs, case, np):
    result = waiting_jobs[case, np]
    assert result.returncode == 0, result.output
    name = "lonely" if case == "stall" else "step"
    missing = list(range(1, np))
    assert re.search(rf"WARNING: Stall: tensor '{name}' \(allreduce\) waited .* missing on rank\(s\) {re.escape(str(missing))}", result.output), result.output
    for rank in range(np):
        caught = [x for x in result.lines(rank) if x.startswith("caught StallError")]
        assert len(caught) == 2, result.output  # the waiting call, then a later call fails at once
        assert f"tensor '{name}'" in caught[0] and f"missing on rank(s) {missing}" in caught[0]
    assert result.seconds < TOGETHER_START + 15


@pytest.mark.parametrize(("np", "floats"), SILENT_CASES)
def test_rank_that_stops_answering_ends_the_job_and_is_named(waiting_jobs, np, floats):
    timeout = SILENCE_TIMEOUT
    result = waiting_jobs["silent", np, floats]
    assert result.returncode != 0, result.output
    reachable = [0, *range(2, np)]
    for rank in reachable:  # every other rank names the silent one and the ones that did answer
        assert any(f"rank {rank}: " in line and f"made no progress for {timeout} s (HVDLITE_COMM_TIMEOUT_SECONDS="
                   f"{timeout}); rank(s) [1] did not answer a probe" in line and f"rank(s) {reachable} did" in line
                   for line in result.lines(rank)), result.output
    # deadline + probe window (3 s) + abort grace, after the jobs' start-up
    assert result.seconds < TOGETHER_START + timeout + 3 + 10, result.output


def test_a_rank_that_came_late_to_the_stuck_step_still_answers_the_probe(waiting_jobs):
    # Rank 1 stops for good; rank 2 is paused for 3 s before the same step, so its wait starts 3 s
    # after rank 0's. Rank 0's deadline (4 s) passes first and it probes for 2 s (the idle cycle
    # + 1 s); rank 2's own deadline would pass only after that. Rank 2's wait must see rank 0's
    # probe and answer at once, or each takes the other for unreachable.
    timeout = LATE_TIMEOUT
    result = waiting_jobs["late"]
    assert result.returncode != 0, result.output
    assert any("rank 0: " in line and f"made no progress for {timeout} s (HVDLITE_COMM_TIMEOUT_SECONDS={timeout}); "
               "rank(s) [1] did not answer a probe" in line and "rank(s) [0, 2] did" in line
               for line in result.lines(0)), result.output
