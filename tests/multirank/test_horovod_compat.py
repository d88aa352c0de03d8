"""Horovod scripts' calls that hvdlite once answered differently (signatures, return values), at np=2 and 3."""

import pytest

from .harness import run_script

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("np", [2, 3])
def test_torch_signatures_and_handles_as_horovods(np):
    result = run_script("torch_horovod_compat.py", np, timeout=180)
    cases = ["grouped_async_handles", "reducescatter_signature", "broadcast_parameters_list",
             "two_optimizers_with_groups"]
    for rank in range(np):
        assert [line[3:] for line in result.lines(rank) if line.startswith("ok ")] == cases, result.output
