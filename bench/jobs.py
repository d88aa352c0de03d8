"""Launching a bench script's worker job and reading back its one tagged JSON line; timing a call
inside that job."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any


def launch_worker(script: str, np: int, worker_args: list[str], tag: str, env: dict[str, str],
                  prefix: list[str] | None = None, launcher_args: list[str] | None = None) -> dict[str, Any]:
    """Run ``PREFIX hvdliterun -np NP LAUNCHER_ARGS python SCRIPT --worker WORKER_ARGS`` and return the
    JSON rank 0 printed after ``tag``; exit with the job's output if it failed. ``prefix``: where
    hvdliterun runs (a network-namespace host); ``launcher_args``: e.g. its ``-H`` hosts."""
    beside = os.path.join(os.path.dirname(sys.executable), "hvdliterun")
    command = [*(prefix or []), beside, "-np", str(np), *(launcher_args or []), sys.executable,
               os.path.abspath(script), "--worker", *worker_args]
    print("$ " + " ".join(command), flush=True)
    proc = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"job failed with exit code {proc.returncode}")
    return json.loads(re.search(f"{tag}(.*)$", proc.stdout, re.MULTILINE).group(1))


def timed(fn: Callable[[], object], iters: int, comm: Any) -> float:
    """Mean seconds per call of ``fn`` on the slowest rank of ``comm`` (an mpi4py communicator)."""
    from mpi4py import MPI

    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return comm.allreduce((time.perf_counter() - start) / iters, op=MPI.MAX)
