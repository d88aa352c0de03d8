"""torch CUDA tensors through the GPU plane on real ranks (needs a GPU; see conftest.py).

np=1 is a size-1 NCCL communicator. np=2 on one GPU uses the host-staged plane by default, and
NCCL itself with NCCL_MULTI_RANK_GPU_ENABLE=1 (experimental, NCCL >= 2.30; with an older NCCL the
job must fall back to host staging and say why). Each test also checks which plane rank 0
reported, so a silent fallback cannot pass as NCCL. "semantics" checks each collective against the
same call on CPU tensors (tests/gpu/scripts/torch_semantics.py).
"""

from pathlib import Path

import pytest

from hvdlite.gpu import nccl
from tests.multirank.harness import run_job

SCRIPT = Path(__file__).parent / "scripts" / "torch_cuda.py"
PLANES = {
    "nccl": ({}, "hvdlite GPU data plane: NCCL"),
    "staged": ({"HVDLITE_GPU_OPERATIONS": "MPI"}, "hvdlite GPU data plane: MPI"),
    "multi_rank_nccl": ({"NCCL_MULTI_RANK_GPU_ENABLE": "1"}, "hvdlite GPU data plane: NCCL"),
    "shared_default": ({}, "hvdlite GPU data plane: MPI"),
}
CASES = [(1, "nccl"), (1, "staged"), (2, "shared_default"), (2, "multi_rank_nccl"), (3, "shared_default")]


@pytest.mark.parametrize("case", ["ops", "optimizer", "semantics", "adasum"])
@pytest.mark.parametrize("np,plane", CASES)
def test_torch_cuda_tensors(np, plane, case):
    env, reported = PLANES[plane]
    if plane == "multi_rank_nccl" and nccl.version() < 23000:
        reported = "hvdlite GPU data plane: MPI (ranks [0, 1] share one GPU; NCCL_MULTI_RANK_GPU_ENABLE needs NCCL >= 2.30"
    result = run_job(["python", str(SCRIPT), case], np=np, env={"HVDLITE_LOG_LEVEL": "INFO", **env}, timeout=300)
    assert result.returncode == 0, result.output
    assert reported in result.output, result.output
    for rank in range(np):
        assert f"ok {case}" in result.lines(rank), result.output
