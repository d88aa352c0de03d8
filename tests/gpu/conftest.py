"""GPU tests: they skip without a GPU, and fail instead when HVDLITE_TEST_GPU=1, so a run on a GPU
machine cannot pass by skipping. (JAX's tests skip when jax has no CUDA build: it is optional.)"""

import os

import pytest


def _gpu_missing() -> str:
    from hvdlite.gpu.arrays import device_count

    if device_count() == 0:
        return "cupy sees no CUDA device (no GPU, no driver, or no 'hvdlite[gpu]')"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch has no CUDA (a CPU build)"
    return ""


@pytest.fixture(autouse=True)
def require_gpu():
    missing = _gpu_missing()
    if missing:
        if os.environ.get("HVDLITE_TEST_GPU") == "1":
            pytest.fail(f"HVDLITE_TEST_GPU=1 but {missing}")
        pytest.skip(missing)
