"""The GPU training-mode scripts (tests/gpu/scripts) with ``--device cpu`` at np=2, so that CI, which
has no GPU, keeps them working: both copies of each mode then train on the CPU, and every mode
must pass. The elastic GPU script is not run here: elastic_shrink.py covers its CPU path
(test_elastic.py)."""

import re
import sys
from pathlib import Path

import pytest

from tests.gpu.test_training_modes import JAX_MODES, TORCH_MODES

from .harness import run_job

pytestmark = pytest.mark.multirank
GPU_SCRIPTS = Path(__file__).resolve().parents[1] / "gpu" / "scripts"


@pytest.mark.parametrize(("script", "framework", "modes"), [("torch_modes.py", "torch", TORCH_MODES),
                                                            ("jax_modes.py", "jax", JAX_MODES)])
def test_every_training_mode_script_passes_with_both_copies_on_the_cpu(script, framework, modes):
    result = run_job(["python", str(GPU_SCRIPTS / script), "--device", "cpu"], np=2, timeout=120)
    assert result.returncode == 0, result.output
    for rank in range(2):
        assert [line for line in result.lines(rank) if line.startswith(("ok ", "FAILED "))] == \
            [f"ok {framework} {mode}" for mode in modes], result.output


BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("np_", [1, 3])
def test_the_gpu_host_cost_bench_runs_each_blocking_call_as_one_nccl_launch_and_one_event(np_):
    """bench/gpu_host_cost.py drives the real NCCL plane through the engine with stand-ins for CUDA
    and NCCL: a blocking in-place allreduce on its caller's stream is one NCCL launch and one event,
    with no stream waits."""
    result = run_job(["python", str(BENCH / "gpu_host_cost.py"), "--calls", "200", "--reps", "1"], np=np_,
                     timeout=120)
    assert result.returncode == 0, result.output
    lines = result.lines(0)
    assert any(line.startswith("  GPU path (stand-in CUDA and NCCL): ") for line in lines), result.output
    (calls,) = [line for line in lines if line.startswith("CUDA and NCCL calls a GPU-path call: ")]
    assert "ncclAllReduce 1.000" in calls and "cudaEventRecord 1.000" in calls, calls
    assert "cudaStreamWaitEvent" not in calls, calls
    if np_ == 1 and sys.version_info[:2] == (3, 11):  # the counts are Python's: 3.12 executes fewer
        # The small-op path's budget (#48): the bytecodes a blocking call executes do not vary from run
        # to run, so a change that adds Python to the path of every small collective shows here.
        codes = {path: int(re.search(r"; (\d+) bytecodes", line).group(1)) for line in lines
                 for path in ("GPU path", "CPU path") if line.startswith(f"  {path}")}
        assert codes["CPU path"] <= 400 and codes["GPU path"] <= 500, codes
