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


@pytest.mark.parametrize("np", [2, 3])
def test_horovod_settings_take_effect_and_unsupported_ones_are_reported_once(np):
    result = run_script("horovod_settings.py", np, env={"HOROVOD_LOG_LEVEL": "error", "HVDLITE_LOG_LEVEL": "warning"},
                        timeout=120)
    for rank in range(np):
        lines = [line for line in result.lines(rank) if not line.startswith("[hvdlite rank")]
        assert lines[0] == "fusion=8388608 cycle=3.5 log=WARNING", result.output  # HVDLITE_* wins
        assert lines[1:] == ([] if rank == 0 else [f"others sum {sum(range(2, np + 1))}"]), result.output
    reports = [line for line in result.output.splitlines() if "HOROVOD_CPU_OPERATIONS='gloo' is not supported" in line]
    conflicts = [line for line in result.output.splitlines() if "HOROVOD_LOG_LEVEL='error'" in line]
    assert len(reports) == 1 and len(conflicts) == 1 and "rank 0" in reports[0], result.output
