"""Adasum on real ranks at np=2 and 4 (Horovod's power-of-two path) and np=3 (a leftover rank folded
into rank 0): the allreduce against hvdlite.adasum.reference (scripts/adasum_ops.py), and torch's
DistributedOptimizer(op=Adasum) against a replay of every rank's own step (scripts/adasum_optimizer.py)."""

import pytest

from .harness import SCRIPTS, run_job

pytestmark = pytest.mark.multirank
CASES = ["core", "torch", "process set", "errors"]


@pytest.mark.parametrize("np", [2, 3, 4])
def test_adasum_equals_the_reference_tree_on_every_rank(np):
    result = run_job(["python", str(SCRIPTS / "adasum_ops.py")], np=np, timeout=180)
    assert result.returncode == 0, result.output
    for rank in range(np):
        assert [line for line in result.lines(rank) if line.startswith("ok ")] == \
            [f"ok adasum {case}" for case in CASES], result.output


OPTIMIZER_CASES = ["sgd", "adam", "backward_passes_per_step", "process set"]


@pytest.mark.parametrize("np", [2, 3, 4])
def test_the_adasum_optimizer_combines_each_ranks_parameter_changes(np):
    result = run_job(["python", str(SCRIPTS / "adasum_optimizer.py")], np=np, timeout=180)
    assert result.returncode == 0, result.output
    for rank in range(np):
        assert [line for line in result.lines(rank) if line.startswith("ok ")] == \
            [f"ok adasum optimizer {case}" for case in OPTIMIZER_CASES], result.output
