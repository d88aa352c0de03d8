"""hvdlite.tensorflow and hvdlite.tensorflow.keras on real ranks: training equivalence, gradients,
callbacks, state, errors. The collectives themselves run through the shared body in
test_collectives.py (framework=tensorflow and tensorflow-graph)."""

from pathlib import Path

import pytest

from .harness import run_script

pytestmark = pytest.mark.multirank
FIT_CASES = ["sgd", "adam clipnorm", "adam global_clipnorm", "sgd momentum predivide", "loss scale",
             "gradient_accumulation_steps=2", "backward_passes_per_step=2"]
TAPE_CASES = ["gradient tape compiled=False", "gradient tape compiled=True"]
API_CASES = ["gradients", "static_shapes", "sparse", "variables", "callbacks", "mixed_precision", "errors"]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _ok_lines(result, rank):
    return [line.split(" max diff")[0].removeprefix("ok ") for line in result.lines(rank) if line.startswith("ok ")]


@pytest.mark.parametrize("np", [2, 3])
@pytest.mark.parametrize("loop, cases", [("fit", FIT_CASES), ("tape", TAPE_CASES)])
def test_training_matches_one_process_on_the_whole_batch(np, loop, cases):
    result = run_script("tf_training.py", np, loop, timeout=240)
    for rank in range(np):
        assert _ok_lines(result, rank) == cases, result.output


@pytest.mark.parametrize("np", [2, 3])
def test_tensorflow_api(np):
    result = run_script("tf_api.py", np, ",".join(API_CASES), timeout=240)
    for rank in range(np):
        assert _ok_lines(result, rank) == API_CASES, result.output


def test_saved_model_loads_back_with_and_without_hvdlite(tmp_path):
    result = run_script("tf_api.py", 2, "state", str(tmp_path), timeout=240)
    for rank in range(2):
        assert _ok_lines(result, rank) == ["state"], result.output
