"""Runs real jobs through the real ``hvdliterun`` and shows every rank's output when one fails."""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hvdlite.core.mpi_start import QUIET_WAITS

from .scripts.together import STARTS as TOGETHER_STARTS  # its line before each command's output

SCRIPTS = Path(__file__).parent / "scripts"
# One compute thread per rank: this machine has two cores and tests run up to three ranks.
# TF_* keep TensorFlow to one thread per rank and quiet; NPROC limits JAX (XLA_FLAGS do not).
# QUIET_WAITS: MPICH sleeps in its blocking waits, as hvdlite asks where a host has more ranks than
# cores (hvdlite.core.mpi_start): the suite runs two jobs at once, so even an np=2 job shares its cores.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3",
              "TF_ENABLE_ONEDNN_OPTS": "0", "NPROC": "1", **QUIET_WAITS}
# XLA's CPU backend compiles every jitted function with LLVM's full optimisation, and on the tests'
# small models compiling is most of a JAX job (jax_training at np=3: 27.8 -> 23.5 s CPU without it).
# Every rank and every in-job reference runs with the same flags, so bit-for-bit checks still hold.
FAST_XLA = {"XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"}


@dataclasses.dataclass
class JobResult:
    returncode: int
    output: str
    seconds: float

    def lines(self, rank: int) -> list[str]:
        prefix = f"[{rank}]: "
        return [line[len(prefix):] for line in self.output.splitlines() if line.startswith(prefix)]

    def command_lines(self, rank: int, command: str) -> list[str]:
        """What ``rank`` printed on stdout while scripts/together.py ran ``command`` (one of its arguments)."""
        lines, mine = [], False
        for line in self.lines(rank):
            if line.startswith(TOGETHER_STARTS):
                mine = line == TOGETHER_STARTS + command
            elif mine:
                lines.append(line)
        return lines


def hvdliterun() -> str:
    found = shutil.which("hvdliterun", path=os.path.dirname(sys.executable)) or shutil.which("hvdliterun")
    assert found, "hvdliterun is not installed; pip install -e '.[test]'"
    return found


def run_job(args: list[str], np: int | None = None, env: dict[str, str] | None = None,
            timeout: float = 120, wrap: list[str] | None = None) -> JobResult:
    """Run ``hvdliterun [-np N] ARGS``; kill the whole job and fail if it outlives ``timeout``.

    ``wrap`` is a command prefix hvdliterun runs under (e.g. on a namespace "host").
    """
    argv = (wrap or []) + [hvdliterun()] + (["-np", str(np)] if np is not None else []) + args
    full_env = {**os.environ, **ONE_THREAD, **FAST_XLA, **(env or {})}
    start = time.monotonic()
    process = subprocess.Popen(argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise AssertionError(f"job {argv} did not finish within {timeout} s; output:\n{output}") from None
    return JobResult(process.returncode, output, time.monotonic() - start)


def run_script(script: str, np: int, *args: str, env: dict[str, str] | None = None,
               timeout: float = 120, expect_ok: bool = True) -> JobResult:
    result = run_job(["python", str(SCRIPTS / script), *args], np=np, env=env, timeout=timeout)
    if expect_ok:
        assert result.returncode == 0, f"job failed with exit code {result.returncode}; output:\n{result.output}"
    return result


def run_scripts_together(jobs: dict[object, tuple[str, int, tuple[str, ...], dict[str, str]]],
                         timeout: float = 120) -> dict[object, JobResult]:
    """Run several jobs at once, ``{key: (script, np, args, env)}``, and return each one's result.

    For jobs that mostly wait (stall and silence deadlines): run one after the other they leave the
    cores idle for seconds each. Exit codes are not checked: each test checks its own job.
    """
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {key: pool.submit(run_job, ["python", str(SCRIPTS / script), *args], np, env, timeout)
                   for key, (script, np, args, env) in jobs.items()}
        return {key: future.result() for key, future in futures.items()}


def shared_script(script: str, np: int, *args: str, env: dict[str, str] | None = None,
                  timeout: float = 240) -> JobResult:
    """The result of one job that several tests share (same script, size, arguments and environment):
    it runs once per test session, for the first test that asks; each test checks its own part of it.
    Its output and exit code are kept whatever they are: a failure shows in every test that shares it."""
    return _shared(script, np, args, tuple(sorted((env or {}).items())), timeout)


def shared_jobs_in_order(jobs: list[tuple[int, list[str]]], index: int, timeout: float = 600) -> JobResult:
    """The result of ``jobs[index]``, one of several shared ``together.py`` jobs (``(np, commands)``)
    that must run in their order, because a later one loads what an earlier one saved: the jobs
    before it run first (each once per session, as :func:`shared_script`'s)."""
    for np, commands in jobs[:index]:
        shared_script("together.py", np, *commands, timeout=timeout)
    np, commands = jobs[index]
    return shared_script("together.py", np, *commands, timeout=timeout)


@dataclasses.dataclass(frozen=True)
class CheckpointAcrossSizes:
    """Three shared ``together.py`` jobs, run in order, for scripts that save a checkpoint at one size
    and load it at the other: np=2 saves into ``folder/at2``; np=3 saves into ``at3`` and loads
    ``at2``; a last np=2 job loads ``at3``. ``commands(save, load)``: a job's commands, given the
    folder it saves into and the one it loads from (``None``: it does not). ``jobs(index)``: the
    result of job ``index`` (those before it run first)."""

    folder: Path
    commands: Callable[[Path | None, Path | None], list[str]]

    def job_commands(self, index: int) -> list[str]:
        save, load = [("at2", None), ("at3", "at2"), (None, "at3")][index]
        return self.commands(save and self.folder / save, load and self.folder / load)

    def __call__(self, index: int) -> JobResult:
        order = [(np, self.job_commands(position)) for position, np in enumerate((2, 3, 2))]
        return shared_jobs_in_order(order, index, timeout=240)


def checkpoint_across_sizes(folder: Path, commands: Callable[[Path | None, Path | None], list[str]]
                            ) -> CheckpointAcrossSizes:
    """:class:`CheckpointAcrossSizes` in ``folder``, with its two checkpoint folders made."""
    for name in ("at2", "at3"):
        (folder / name).mkdir()
    return CheckpointAcrossSizes(folder, commands)


@functools.cache
def _shared(script: str, np: int, args: tuple[str, ...], env: tuple[tuple[str, str], ...], timeout: float) -> JobResult:
    return run_job(["python", str(SCRIPTS / script), *args], np=np, env=dict(env), timeout=timeout)
