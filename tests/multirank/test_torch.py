"""hvdlite.torch on real ranks: training equivalence, gradients of every op, the optimizer's API.

The collectives themselves run through the shared body in test_collectives.py (framework=torch).
"""

import pytest

from .harness import run_script

pytestmark = pytest.mark.multirank
EQUIVALENCE = [
    "sgd passes=1 compression=none groups=None compiled=False",
    "sgd passes=2 compression=none groups=None compiled=False",
    "adam passes=1 compression=none groups=None compiled=False",
    "adam passes=2 compression=none groups=None compiled=False",
    "sgd passes=1 compression=fp16 groups=None compiled=False",
    "adam passes=2 compression=bf16 groups=None compiled=False",
    "sgd passes=1 compression=none groups=2 compiled=False",
    "adam passes=1 compression=none groups=None compiled=True",
]


def _ok_lines(result, rank):
    return [line for line in result.lines(rank) if line.startswith("ok ")]


@pytest.mark.parametrize("np", [2, 3])
def test_training_matches_one_process_on_the_whole_batch(np):
    result = run_script("torch_training.py", np, "equivalence", timeout=240)
    for rank in range(np):
        got = [line.split(" max diff")[0].removeprefix("ok ") for line in _ok_lines(result, rank)]
        assert got == EQUIVALENCE, result.output


@pytest.mark.parametrize("case", ["gradients", "optimizer", "grad_scaler", "state", "sparse", "errors"])
@pytest.mark.parametrize("np", [2, 3])
def test_torch_api(np, case):
    result = run_script("torch_api.py", np, case)
    for rank in range(np):
        assert _ok_lines(result, rank) == [f"ok {case}"], result.output
