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
        own, shared, mixed, after = rank_lines[1:5]
        assert own == "own Choice(plane='NCCL', reason='NCCL 2.32.3, one GPU per rank')", own
        assert shared.startswith("shared Choice(plane='MPI'") and f"ranks {list(range(np))} share one GPU" in shared
        per_rank = ", ".join(f"rank {r}: {'cpu' if r == 0 else 'cuda'}" for r in range(np))
        assert mixed == f"mixed: Mismatched device for allreduce of tensor 'mixed': {per_rank}", mixed
        assert after == f"after {[float(sum(range(1, np + 1)))] * 2}", after


@pytest.mark.parametrize("np", [2, 3])
def test_hierarchical_groups_split_by_host_and_local_roots_reduce_across_hosts(np):
    """The MPI side of HVDLITE_HIERARCHICAL_ALLREDUCE with simulated hosts (a, b; or a, a, b)."""
    result = run_script(SCRIPTS / "gpu_setup.py", np=np, timeout=120)
    assert result.returncode == 0, result.output
    hier = {rank: result.lines(rank)[5].split() for rank in range(np)}
    hosts = ["a", "a", "b"] if np == 3 else ["a", "b"]
    for rank, (tag, host, place, _, count, _, _uid) in hier.items():
        assert (tag, host, count) == ("hier", hosts[rank], "2"), hier[rank]
        local_rank = hosts[:rank].count(hosts[rank])
        assert place == f"{local_rank}/{hosts.count(hosts[rank])}", hier[rank]
    # Ranks on one host share their host's NCCL id; hosts have different ids.
    assert len({hier[r][6] for r in range(np)}) == 2
    assert all(hier[r][6] == hier[hosts.index(hosts[r])][6] for r in range(np))
    roots = [hosts.index(h) for h in dict.fromkeys(hosts)]
    for rank in range(np):
        extra = result.lines(rank)[6:]
        if rank in roots:
            assert extra == [f"cross {[3.0, sum(r + 0.25 for r in roots), -6.0]}", f"cross_max {[max(roots), 1]}"]
        else:
            assert extra == [], extra
