"""JAX GPU arrays through the GPU plane (needs a GPU and jax's CUDA build; skips without the latter)."""

from pathlib import Path

import pytest

from tests.multirank.harness import run_job

SCRIPT = Path(__file__).parent / "scripts" / "jax_cuda.py"


def _jax_gpus() -> int:
    jax = pytest.importorskip("jax")
    try:
        return len(jax.devices("gpu"))
    except RuntimeError:
        return 0


@pytest.mark.parametrize("np", [1, 2])
def test_jax_gpu_arrays(np):
    if _jax_gpus() == 0:
        pytest.skip("jax has no CUDA build here (pip install 'jax[cuda12]')")
    result = run_job(["python", str(SCRIPT)], np=np, env={"HVDLITE_LOG_LEVEL": "INFO"}, timeout=300)
    assert result.returncode == 0, result.output
    assert "hvdlite GPU data plane:" in result.output, result.output
    for rank in range(np):
        assert "ok jax" in result.lines(rank), result.output
