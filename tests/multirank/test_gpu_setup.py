"""The GPU plane's collective setup on real ranks, no GPU needed (see scripts/gpu_setup.py)."""

import pytest

from hvdlite.gpu import nccl

from .harness import SCRIPTS, run_script

pytestmark = [pytest.mark.multirank,
              pytest.mark.skipif(not nccl.available(), reason="nvidia-nccl-cu12 is not installed")]


@pytest.mark.parametrize("np", [2, 3])
def test_every_rank_gets_rank_0s_nccl_id_and_the_same_plane_and_the_same_mismatch_error(np):
    result = run_script(SCRIPTS / "gpu_setup.py", np=np, timeout=120)
    assert result.returncode == 0, result.output
    lines = [result.lines(rank) for rank in range(np)]
    uid = lines[0][0]
    assert uid.startswith("uid 128 ") and all(rank_lines[0] == uid for rank_lines in lines), lines
    for rank_lines in lines:
        own, shared, mixed, after = rank_lines[1:]
        assert own == "own Choice(plane='NCCL', reason='NCCL 2.32.3, one GPU per rank')", own
        assert shared.startswith("shared Choice(plane='MPI'") and f"ranks {list(range(np))} share one GPU" in shared
        per_rank = ", ".join(f"rank {r}: {'cpu' if r == 0 else 'cuda'}" for r in range(np))
        assert mixed == f"mixed: Mismatched device for allreduce of tensor 'mixed': {per_rank}", mixed
        assert after == f"after {[float(sum(range(1, np + 1)))] * 2}", after
