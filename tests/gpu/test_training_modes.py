"""Every training mode on the GPU against the CPU result of the same seed and data (issue #35).

torch (tests/gpu/scripts/torch_modes.py): np=1 on NCCL, np=2 and np=3 sharing the GPU (host-staged
plane); JAX/optax (jax_modes.py): np=1 and np=2, skipped when jax has no CUDA build; an elastic job
on CUDA tensors whose rank 2 of 3 is SIGKILLed (torch_elastic_gpu.py). One job per script and size
runs every mode, and each test reads its own mode's line from it, so a failing mode names itself
while the GPU time stays a few jobs. A job that outlives its timeout is kept as failed rather than
run again by the next test of the same job. (tests/multirank/test_gpu_scripts_on_cpu.py runs the
same scripts with --device cpu, where CI runs.)
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.multirank.harness import JobResult, run_job

SCRIPTS = Path(__file__).parent / "scripts"
TORCH_MODES = ["plain", "backward_passes_per_step", "shard_optimizer_state", "local_sgd", "local_sgd_adam",
               "local_sgd_overlap", "powersgd", "fp16", "bf16", "process_set", "sync_batch_norm"]
JAX_MODES = ["plain", "plain_jit", "backward_passes_per_step", "backward_passes_per_step_jit", "shard_optimizer_state",
             "shard_optimizer_state_jit", "local_sgd", "local_sgd_adam_jit", "powersgd", "powersgd_jit", "fp16", "bf16",
             "process_set", "process_set_jit"]
PLANE = {1: "hvdlite GPU data plane: NCCL", 2: "hvdlite GPU data plane: MPI", 3: "hvdlite GPU data plane: MPI"}
# Under the per-test limit the GPU runs use (pytest --timeout 150): the first test of a job waits for all of it.
TIMEOUT = 140


@functools.cache
def _job(launch: tuple[str, ...], np: int) -> JobResult:
    """``hvdliterun -np NP LAUNCH`` at INFO (rank 0 names the GPU plane), run once per session."""
    try:
        return run_job(list(launch), np=np, env={"HVDLITE_LOG_LEVEL": "INFO"}, timeout=TIMEOUT)
    except AssertionError as timeout:  # kept: the other tests of this job fail at once instead of waiting again
        return JobResult(-1, str(timeout), TIMEOUT)


def _modes_job(script: str, np: int) -> JobResult:
    return _job(("python", str(SCRIPTS / script)), np)


def _check_mode(result: JobResult, framework: str, mode: str, np: int) -> None:
    for rank in range(np):
        lines = result.lines(rank)
        failed = [line for line in lines if line.startswith(f"FAILED {framework} {mode}:")]
        assert not failed, "\n".join(failed)
        assert f"ok {framework} {mode}" in lines, result.output


@pytest.mark.parametrize("np", [1, 2, 3])
def test_torch_modes_job_uses_the_expected_plane_and_passes(np):
    result = _modes_job("torch_modes.py", np)
    assert PLANE[np] in result.output, result.output
    assert result.returncode == 0, result.output


@pytest.mark.parametrize("mode", TORCH_MODES)
@pytest.mark.parametrize("np", [1, 2, 3])
def test_torch_mode_on_cuda_tensors_matches_the_cpu_result(np, mode):
    _check_mode(_modes_job("torch_modes.py", np), "torch", mode, np)


@functools.cache
def _jax_gpus() -> int:
    """GPUs jax sees, asked in a child process: in this one, jax would hold most of the GPU's memory."""
    if importlib.util.find_spec("jax") is None:
        return 0
    probe = subprocess.run([sys.executable, "-c", "import jax; print(len(jax.devices('gpu')))"],
                           env={**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, capture_output=True,
                           text=True, timeout=120)
    return int(probe.stdout.split()[-1]) if probe.returncode == 0 and probe.stdout.split() else 0


def _jax_job(np: int) -> JobResult:
    if _jax_gpus() == 0:
        pytest.skip("jax has no CUDA build here (pip install 'jax[cuda12]')")
    return _modes_job("jax_modes.py", np)


@pytest.mark.parametrize("np", [1, 2])
def test_jax_modes_job_uses_the_gpu_plane_and_passes(np):
    result = _jax_job(np)
    assert PLANE[np] in result.output, result.output
    assert result.returncode == 0, result.output


@pytest.mark.parametrize("mode", JAX_MODES)
@pytest.mark.parametrize("np", [1, 2])
def test_jax_mode_on_gpu_arrays_matches_the_cpu_result(np, mode):
    _check_mode(_jax_job(np), "jax", mode, np)


def test_elastic_survivors_of_a_killed_rank_finish_on_cuda_tensors():
    result = _job(("--min-np", "2", "python", str(SCRIPTS / "torch_elastic_gpu.py")), 3)
    assert result.returncode == 0, result.output
    assert PLANE[3] in result.output, result.output
    assert "the job went on without rank(s) [2] and finished" in result.output, result.output
    for rank in (0, 1):
        lines = result.lines(rank)
        assert f"new rank {rank} size 2" in lines and "ok torch elastic gpu" in lines, result.output
