"""Adasum allreduce on real ranks (tests/multirank/scripts/adasum_ops.py): at np=2 and 4 (Horovod's
power-of-two path) and np=3 (a leftover rank folded into rank 0), against hvdlite.adasum.reference."""

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
