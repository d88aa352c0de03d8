"""Adasum on real ranks at np=2 and 4 (Horovod's power-of-two path) and np=3 (a leftover rank folded
into rank 0): the allreduce against hvdlite.core.transport.adasum_math.reference (scripts/adasum_ops.py), and torch's
DistributedOptimizer(op=Adasum) against a replay of every rank's own step (scripts/adasum_optimizer.py)."""

import pytest

from .harness import JobResult, shared_script
from .jax_job import ADASUM as JAX_ADASUM

pytestmark = pytest.mark.multirank
CASES = ["core", "torch", "tiny", "process set", "errors"]
OPTIMIZER_CASES = ["sgd", "adam", "backward_passes_per_step", "process set"]


# One job per size runs the torch scripts (together.py: torch starts once per rank), at np=3 and 4 also
# the GPU Adasum's MPI side and at np=4 the digits accuracy check.
GPU_HOSTS, DIGITS = "gpu_adasum_hosts.py", "adasum_digits.py"
TOGETHER = {2: ("adasum_ops.py", "adasum_optimizer.py"), 3: ("adasum_ops.py", "adasum_optimizer.py", GPU_HOSTS),
            4: ("adasum_ops.py", "adasum_optimizer.py", GPU_HOSTS, DIGITS)}


def _together(np: int) -> JobResult:
    return shared_script("together.py", np, *TOGETHER[np], timeout=400)


def _ok_lines(np: int, script: str) -> tuple[dict[int, list[str]], str]:
    """Each rank's "ok ..." lines from ``script``'s run in the job of size ``np``."""
    result = _together(np)
    lines = {rank: [line for line in result.command_lines(rank, script) if line.startswith("ok ")] for rank in range(np)}
    return lines, result.output


@pytest.mark.parametrize("np", [2, 3, 4])
def test_adasum_equals_the_reference_tree_on_every_rank(np):
    lines, output = _ok_lines(np, "adasum_ops.py")
    for rank in range(np):
        assert lines[rank] == [f"ok adasum {case}" for case in CASES], output


@pytest.mark.parametrize("np", [2, 3, 4])
def test_the_adasum_optimizer_combines_each_ranks_parameter_changes(np):
    lines, output = _ok_lines(np, "adasum_optimizer.py")
    for rank in range(np):
        assert lines[rank] == [f"ok adasum optimizer {case}" for case in OPTIMIZER_CASES], output


KERAS_CASES = ["sgd eager", "adam fit", "adam tf.function", "backward_passes_per_step", "process set", "loss scale",
               "refusals"]


# The Keras and optax optimizers at np=2 and 3: the recursive halving over 4 ranks (two levels) is the
# core's, run at np=4 by the reference-tree and the torch optimizer tests above. The Keras one runs in
# the TensorFlow job that several files share (tensorflow_job.py).
@pytest.mark.parametrize("np", [2, 3])
def test_the_keras_adasum_optimizer_combines_each_ranks_variable_changes(np, tensorflow_job):
    result = tensorflow_job(np)
    for rank in range(np):
        assert [line for line in result.lines(rank) if line.startswith("ok keras adasum ")] == \
            [f"ok keras adasum {case}" for case in KERAS_CASES], result.output


JAX_CASES = ["adam eager", "sgd jit", "adamw jit", "backward_passes_per_step", "process set", "refusals"]


@pytest.mark.parametrize("np", [2, 3])
def test_the_optax_adasum_optimizer_combines_each_ranks_updates(np, jax_job):
    result = jax_job(np)  # the JAX job several files share (jax_job.py)
    for rank in range(np):
        assert [line for line in result.command_lines(rank, JAX_ADASUM) if line.startswith("ok ")] == \
            [f"ok jax adasum {case}" for case in JAX_CASES], result.output


def test_adasum_at_the_single_process_rate_matches_tuned_average_on_digits():
    result = _together(4)
    assert result.output.count("ok adasum digits") == 4, result.output
    accuracy = {" ".join(words[1:3]): float(words[3]) for words in map(str.split, result.command_lines(0, DIGITS))
                if words[:1] == ["accuracy"]}
    assert set(accuracy) == {"average x1", "average x2", "average x4", "adasum x1"}, result.output
    tuned = max(accuracy[mode] for mode in ("average x1", "average x2", "average x4"))
    # The check means something only where the rate matters: Average at the single-process rate lags.
    assert tuned - accuracy["average x1"] > 1.0, accuracy
    assert tuned - accuracy["adasum x1"] <= 1.0, f"Adasum more than a point below tuned Average: {accuracy}"


@pytest.mark.parametrize("np", [3, 4])
def test_gpu_adasum_is_the_adasum_across_hosts_of_each_hosts_average(np):
    """The MPI side of Adasum on GPU tensors (simulated hosts; no GPU needed)."""
    result = _together(np)
    for rank in range(np):
        assert [line for line in result.command_lines(rank, GPU_HOSTS) if line.startswith("ok ")] == \
            ["ok average then adasum float32", "ok average then adasum float64", "ok cross host adasum bfloat16"], \
            result.output
