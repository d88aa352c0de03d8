"""hvdlite under a real Slurm (Debian's slurmctld, slurmd and munge) with two nodes: the two network-
namespace hosts of testbed/netns.py. Jobs are submitted on hostA, where the controller runs; every rank and
daemon talks over the namespaces' own link. Root only; skipped with the reason elsewhere."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from testbed.netns import IFACE, make_two_hosts
from testbed.netns import unavailable as no_namespaces

from .harness import ONE_THREAD, SCRIPTS, hvdliterun
from .slurm_cluster import start_cluster
from .slurm_cluster import unavailable as no_slurm
from .test_multihost import _assert_nothing_left
from .test_torch import EQUIVALENCE

pytestmark = [pytest.mark.multirank, pytest.mark.netns]
_WHY_NOT = no_namespaces() or no_slurm()
if _WHY_NOT:
    pytestmark.append(pytest.mark.skip(reason=f"Slurm tests need namespaces and Slurm: {_WHY_NOT}"))

# Across namespaces MPI must use the veth, not shared memory; hvdliterun's flags say which interface.
TRANSPORT = ["--network-interface", IFACE, "-x", "UCX_TLS=tcp,self"]


@pytest.fixture(scope="session")  # session: the time-limit test runs last of all (tests/conftest.py)
def cluster(tmp_path_factory):
    hosts = make_two_hosts(tmp_path_factory.mktemp("hosts"))
    try:
        running = start_cluster(hosts, tmp_path_factory.mktemp("slurm"))
    except BaseException:
        hosts.close()
        raise
    yield running
    running.close()
    hosts.close()


@pytest.fixture(scope="session", autouse=True)
def time_limited_job(cluster, tmp_path_factory):
    """A job of 4 ranks with a one-minute limit, submitted before the file's first test.

    ``--time=1`` is a minute, Slurm's smallest limit, and slurmctld enforces limits on its own timer
    (about every 30 s), so the job ends 60 to 90 s after it started. Its ranks idle (an allreduce
    every 0.1 s) on 2 of each node's 4 CPUs (two a node: by default Slurm puts 3 of 4 on the first),
    so the other tests' jobs (at most 2 tasks a node) run beside it, and the test that checks how it
    ended runs last of the whole session (tests/conftest.py), so it waits little or not at all.
    """
    return _submit_running_job(cluster, tmp_path_factory.mktemp("time-limit"), ["--time=1", "--ntasks-per-node=2"])


def _run(cluster, argv: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    """``argv`` on the controller's host; past ``timeout`` its whole process group is stopped (a hung
    ``srun`` and its tasks would otherwise keep running into later tests)."""
    env = {**os.environ, **ONE_THREAD, **cluster.env}
    with subprocess.Popen(cluster.on_controller(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)  # srun passes it to the step's tasks on every node
            try:
                stdout, stderr = process.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                stdout, stderr = process.communicate()
            raise AssertionError(f"{argv} outlived {timeout} s:\n{stdout}\n{stderr}\n{cluster.log()}") from None
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def _sbatch_until_done(cluster, sbatch_args: list[str], timeout: float = 300) -> str:
    """Submit a batch job and return ``scontrol show job`` once it has ended.

    Polled every 0.5 s: ``sbatch --wait`` polls at doubling intervals (a job that ran 11 s was seen
    ending after 42)."""
    submitted = _run(cluster, ["sbatch", "--parsable", *sbatch_args])
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _run(cluster, ["scontrol", "show", "job", job]).stdout
        if "JobState=" in state and not any(f"JobState={s}" in state for s in ("PENDING", "RUNNING", "COMPLETING",
                                                                             "CONFIGURING")):
            return state
        time.sleep(0.5)
    _run(cluster, ["scancel", job])
    raise AssertionError(f"batch job {job} outlived {timeout} s:\n{state}\n{cluster.log()}")


def _lines(output: str, prefix: str) -> list[str]:
    return sorted(line.split(": ", 1)[1] for line in output.splitlines() if ": " in line
                  and line.split(": ", 1)[1].startswith(prefix))


@pytest.mark.parametrize("tasks", [2, 4])
def test_salloc_runs_one_rank_per_task_slot_on_both_nodes_without_np(cluster, tasks):
    per_host = tasks // 2
    done = _run(cluster, ["salloc", "-N", "2", "--ntasks-per-node", str(per_host), hvdliterun(), *TRANSPORT,
                          "python", str(SCRIPTS / "multihost.py"), "where", "1"])
    output = done.stdout + done.stderr
    assert done.returncode == 0, output + cluster.log()
    where = _lines(output, "where ")
    assert len(where) == tasks and output.count("ok where") == tasks, output
    for rank in range(tasks):
        host, local = ("hostA", rank) if rank < per_host else ("hostB", rank - per_host)
        assert any(f"rank={rank} host={host} local={local}/{per_host} cross={rank // per_host}/2" in w for w in where), output


@pytest.mark.parametrize("tasks", [2, 4])
def test_sbatch_trains_torch_across_the_nodes_as_one_process_does(cluster, tmp_path, tasks):
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\nexec {hvdliterun()} {' '.join(TRANSPORT)} python "
                      f"{SCRIPTS / 'torch_training.py'} equivalence\n")
    out = tmp_path / "job.out"
    state = _sbatch_until_done(cluster, ["-N", "2", "--ntasks-per-node", str(tasks // 2), "-o", str(out), str(script)])
    output = out.read_text(errors="replace") if out.exists() else ""
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, state + output + cluster.log()
    for rank in range(tasks):
        got = [line.split(" max diff")[0].removeprefix(f"[{rank}]: ok ") for line in output.splitlines()
               if line.startswith(f"[{rank}]: ok ")]
        assert got == EQUIVALENCE, output


def test_more_ranks_than_the_allocation_is_refused_naming_it(cluster):
    done = _run(cluster, ["salloc", "-N", "2", "-n", "2", hvdliterun(), "-np", "3", "python", "-c", "pass"])
    assert done.returncode == 2, done.stdout + done.stderr
    assert "-np 3 is more than the 2 task slots of Slurm job" in done.stderr, done.stderr
    assert "SLURM_JOB_NODELIST='host" in done.stderr, done.stderr


@pytest.mark.parametrize("script", ["multihost.py", "dense_heap.py"])
def test_plain_srun_with_pmi2_runs_the_ranks_without_hvdliterun(cluster, script):
    # The README's line, nothing added. MPICH speaks PMI-1 to Slurm's pmi2 plugin, which reads a
    # request in one 1024-byte read; UCX's padded business card overflows it when the memory after
    # UCX's address is dense (dense_heap.py: with UCX every such job hung here, as one did in CI).
    # hvdlite picks libfabric under Slurm's PMI (hvdlite/core/mpi_start.py), and every rank says so.
    done = _run(cluster, ["srun", "--mpi=pmi2", "-N", "2", "--ntasks-per-node", "2", sys.executable,
                          str(SCRIPTS / script), "where", "1"], timeout=90)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output + cluster.log()
    assert output.count("ok where") == 4, output
    for rank, where in enumerate(["hostA local=0/2 cross=0/2", "hostA local=1/2 cross=0/2",
                                  "hostB local=0/2 cross=1/2", "hostB local=1/2 cross=1/2"]):
        assert f"where rank={rank} host={where}" in output, output
    assert output.count(" netmod=ofi") == 4, output
    assert "request not begin with" not in cluster.log(), cluster.log()


def test_srun_without_a_pmi_is_refused_on_every_task_instead_of_training_alone(cluster):
    # Slurm's usual MpiDefault=none: each task's MPI_Init makes a world of one, and without the
    # check every task trained alone as rank 0 of 1.
    done = _run(cluster, ["srun", "-N", "2", "--ntasks-per-node", "2", sys.executable,
                          str(SCRIPTS / "multihost.py"), "where", "1"], timeout=90)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "where rank=" not in output and "srun started 4 tasks in Slurm step " in output, output
    for task in range(4):
        assert f"but MPI started task {task} alone (size 1)" in output, output
    assert output.count("Run `srun --mpi=pmi2 ...`, or `hvdliterun python ...` inside the allocation") == 4, output


def _submit_running_job(cluster, tmp_path, sbatch_args: list[str]) -> tuple[str, str, Path]:
    """An hvdliterun job of 4 ranks that all-reduce until stopped, once every rank is up: its
    Slurm job id, the marker in its processes' environment, and its output file."""
    marker = f"HVDLITE_TEST_JOB={uuid.uuid4().hex}"
    script = tmp_path / "forever.sh"
    script.write_text(f"#!/bin/sh\nexec {hvdliterun()} {' '.join(TRANSPORT)} -x {marker} python "
                      f"{SCRIPTS / 'allreduce_forever.py'} 600\n")
    out = tmp_path / "forever.out"
    submitted = _run(cluster, ["sbatch", "--parsable", "-N", "2", "-n", "4", *sbatch_args, "-o", str(out), str(script)])
    assert submitted.returncode == 0, submitted.stderr
    deadline = time.monotonic() + 120
    while (not out.exists() or out.read_text(errors="replace").count("up ") < 4) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert out.exists() and out.read_text(errors="replace").count("up ") == 4, (out.read_text(errors="replace") if out.exists() else "") + cluster.log()
    return submitted.stdout.strip().split(";")[0], marker, out


def _assert_ended_by_slurm(cluster, job: str, marker: str, out: Path, within: float, reason: str) -> None:
    """Every process of ``job`` ends on both nodes within ``within`` s, Slurm forgets the job, and
    the output shows Slurm's ``reason`` and hvdliterun passing Slurm's SIGTERM on to the ranks."""
    started = time.monotonic()
    seconds = _assert_nothing_left(marker, within=within)
    assert seconds < within, f"job {job}'s processes outlived it by {seconds:.1f} s"
    while _run(cluster, ["squeue", "-h", "-j", job]).stdout.strip() and time.monotonic() - started < within:
        time.sleep(0.5)
    assert not _run(cluster, ["squeue", "-h", "-j", job]).stdout.strip(), "the job is still queued"
    # errors="replace" everywhere here: a rank killed mid-write can leave a torn UTF-8 character in
    # Slurm's output file (seen once in CI, at the time limit).
    output = out.read_text(errors="replace")
    assert reason in output and "hvdliterun: got SIGTERM; stopping every rank" in output, output


def test_scancel_ends_the_job_on_both_nodes_with_nothing_left(cluster, tmp_path):
    job, marker, out = _submit_running_job(cluster, tmp_path, [])
    assert _run(cluster, ["scancel", job]).returncode == 0
    _assert_ended_by_slurm(cluster, job, marker, out, within=60, reason="CANCELLED")


def test_an_elastic_job_leaves_a_node_slurm_drains_and_finishes_on_the_other(cluster, tmp_path):
    out = tmp_path / "drain.out"
    script = tmp_path / "elastic.sh"
    script.write_text(f"#!/bin/sh\nexec {hvdliterun()} {' '.join(TRANSPORT)} --min-np 2 python "
                      f"{SCRIPTS / 'elastic_hosts.py'} cut {tmp_path / 'unused'} 2\n")
    submitted = _run(cluster, ["sbatch", "--parsable", "-N", "2", "--ntasks-per-node", "2", "-o", str(out), str(script)])
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 120
        while (not out.exists() or out.read_text(errors="replace").count("started as rank") < 4) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert out.exists() and out.read_text(errors="replace").count("started as rank") == 4, cluster.log()
        drained = _run(cluster, ["scontrol", "update", "NodeName=hostB", "State=DRAIN", "Reason=hvdlite-test"])
        assert drained.returncode == 0, drained.stderr
        while _run(cluster, ["squeue", "-h", "-j", job]).stdout.strip() and time.monotonic() < deadline + 60:
            time.sleep(0.5)
    finally:
        _run(cluster, ["scancel", job])
        _run(cluster, ["scontrol", "update", "NodeName=hostB", "State=RESUME"])
    output = out.read_text(errors="replace")
    assert "hvdliterun: hosts now hostA:2" in output, output
    for rank in (0, 1):  # hostA's ranks went on at size 2; hostB's left at a commit (exit 0)
        assert f"[{rank}]: ok elastic hosts {rank} 2" in output, output
    assert "the job went on without rank(s) [2, 3] and finished" in output, output


def test_a_time_limit_ends_the_job_on_both_nodes_with_the_reason(cluster, time_limited_job):
    # The last test of the session (tests/conftest.py): the job was submitted before the file's first.
    job, marker, out = time_limited_job
    _assert_ended_by_slurm(cluster, job, marker, out, within=150, reason="DUE TO TIME LIMIT")
