"""The real hvdliterun: exit codes, tagged output, dry run, check-build, and Ctrl-C/SIGTERM."""

import os
import re
import signal
import subprocess
import time

import pytest
from hvdlite.runner.process import alive

from .harness import ONE_THREAD, SCRIPTS, hvdliterun, run_job

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("args", [["-np", "0", "python", "-V"], ["-np", "3", "-H", "localhost:2", "python", "-V"],
                                  ["-np", "2", "-H", "bad:host:x", "python"], ["-np", "2", "no-such-program"]])
def test_bad_input_is_one_line_and_exit_2(args):
    result = run_job(args, timeout=30)
    assert result.returncode == 2
    assert result.output.count("\n") == 1 and result.output.startswith("hvdliterun: error: ")


def test_output_is_tagged_by_rank_and_exit_code_is_the_failing_ranks():
    code = "import sys, hvdlite as h; h.init(); print('hi'); h.shutdown(); sys.exit(3 if h.rank() == 1 else 0)"
    code = code.replace("h.shutdown(); sys.exit(3 if h.rank() == 1 else 0)", "r = h.rank(); h.shutdown(); sys.exit(3 if r == 1 else 0)")
    result = run_job(["python", "-c", code], np=3, timeout=60)
    assert result.returncode == 3
    for rank in range(3):
        assert result.lines(rank) == ["hi"], result.output


def test_dry_run_prints_the_command():
    result = run_job(["--dry-run", "-H", "localhost:2", "python", "t.py"], np=2, timeout=30)
    assert result.returncode == 0
    assert re.search(r"mpiexec -n 2 -hosts localhost:2 -prepend-pattern .* python t.py$", result.output.strip())


def test_check_build():
    result = run_job(["--check-build"], timeout=60)
    assert result.returncode == 0 and "[X] MPI" in result.output and "Available Frameworks:" in result.output
    # The frameworks are probed quietly: TensorFlow's C++ start-up log must not come before the report.
    assert result.output.startswith("hvdlite v"), result.output


def _start_sleepers(sigint: signal.Handlers) -> tuple[subprocess.Popen, list[int]]:
    """hvdliterun with two sleeping ranks, started with SIGINT set to ``sigint`` (a shell's background
    job starts with it ignored, whatever this test process has); returns it and the ranks' pids."""
    process = subprocess.Popen([hvdliterun(), "-np", "2", "python", str(SCRIPTS / "sleeper.py")],
                               env={**os.environ, **ONE_THREAD}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
    pids = []
    deadline = time.monotonic() + 60
    while len(pids) < 2 and time.monotonic() < deadline:
        line = process.stdout.readline()
        match = re.search(r"pid (\d+)", line)
        if match:
            pids.append(int(match.group(1)))
    if len(pids) < 2:
        os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError("ranks did not start")
    return process, pids


def _assert_stops(process: subprocess.Popen, pids: list[int]) -> None:
    try:
        process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError("hvdliterun did not stop after the signal") from None
    assert process.returncode != 0
    assert not [pid for pid in pids if alive(pid)], "a rank outlived hvdliterun"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_ends_every_rank(signum):
    process, pids = _start_sleepers(signal.SIG_DFL)
    process.send_signal(signum)
    _assert_stops(process, pids)


def test_a_launcher_started_with_sigint_ignored_keeps_it_ignored():
    process, pids = _start_sleepers(signal.SIG_IGN)
    process.send_signal(signal.SIGINT)
    time.sleep(3)  # a forwarded SIGINT ends the sleepers in well under a second
    still_running = process.poll() is None and all(alive(pid) for pid in pids)
    process.send_signal(signal.SIGTERM)
    _assert_stops(process, pids)
    assert still_running, "hvdliterun started with SIGINT ignored stopped on SIGINT"


LATE_RANK = """
import os, time
if os.environ["PMI_RANK"] == "2":
    time.sleep(8)                       # a rank still importing its framework
import hvdlite
cpu = time.process_time()
hvdlite.init()                          # MPI_Init: MPICH busy-waits here for the late rank
print(f"init cpu {time.process_time() - cpu:.2f}")
hvdlite.shutdown()
"""


def test_ranks_waiting_in_init_for_a_late_rank_sleep_rather_than_spin():
    result = run_job(["python", "-c", LATE_RANK], np=3, timeout=120)
    assert result.returncode == 0, result.output
    for rank in (0, 1):
        cpu = [float(line.split()[-1]) for line in result.lines(rank) if line.startswith("init cpu ")]
        # Spinning through the 8 s wait would take 2 s or more even with 8 processes to a core here.
        assert cpu and cpu[0] < 1.0, result.output
