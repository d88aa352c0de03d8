"""The GPU training-mode scripts (tests/gpu/scripts) with ``--device cpu`` at np=2, so that CI, which
has no GPU, keeps them working: both copies of each mode then train on the CPU, and every mode
must pass. The elastic GPU script is not run here: elastic_shrink.py covers its CPU path
(test_elastic.py)."""

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
