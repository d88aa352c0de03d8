"""hvd.elastic for Keras 3 and JAX with real ranks through hvdliterun: the states sync, commit and
restore at np=2 and np=3, Keras's state callbacks commit at the right batches, and the survivors of a
dead rank re-form the job and finish (as test_elastic.py does for PyTorch)."""

import re
from collections.abc import Callable

import pytest

from .harness import SCRIPTS, run_job

pytestmark = pytest.mark.multirank
FRAMEWORKS = ["keras", "jax"]
STATE_LINES = {"keras": ["ok keras elastic state", "ok keras elastic callbacks"], "jax": ["ok jax elastic state"]}


@pytest.mark.parametrize("np", [2, 3])
def test_keras_state_syncs_commits_and_restores(np, tensorflow_job):
    # in the TensorFlow job several files share (tensorflow_job.py): TensorFlow starts once per rank
    _check_state_lines(tensorflow_job(np).lines, "keras", np)


@pytest.mark.parametrize("np", [2, 3])
def test_jax_state_syncs_commits_and_restores(np, jax_job):
    _check_state_lines(jax_job(np).lines, "jax", np)  # in the JAX job several files share (jax_job.py)


def _check_state_lines(lines: Callable[[int], list[str]], framework: str, np: int) -> None:
    for rank in range(np):
        assert [line for line in lines(rank) if line.startswith(f"ok {framework} elastic ")] == \
            STATE_LINES[framework], "\n".join(lines(rank))


@pytest.mark.parametrize("failure", ["kill", "raise"])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_survivors_of_a_dead_rank_re_form_the_job_and_finish_at_np_2(framework, failure):
    # Keras: fit over NumPy arrays, and over a tf.data.Dataset when a rank raises.
    inputs = ["dataset"] if framework == "keras" and failure == "raise" else []
    result = run_job(["--min-np", "2", "python", str(SCRIPTS / f"{framework}_elastic_shrink.py"), failure, *inputs],
                     np=3, timeout=240)
    assert result.returncode == 0, result.output
    assert "the job went on without rank(s) [2] and finished" in result.output, result.output
    for rank in (0, 1):
        lines = result.lines(rank)
        assert "ok elastic shrink" in lines and f"new rank {rank} size 2" in lines, result.output
        seconds = [float(m.group(1)) for line in lines if (m := re.match(r"recovered (\S+)", line))]
        assert seconds and seconds[0] < 10.0, result.output  # generous: this machine is shared
