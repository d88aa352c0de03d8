"""fully_shard on CUDA parameters (needs a GPU; see conftest.py): the cases of
tests/multirank/scripts/fully_sharded.py with both models and the data on the GPU, at np=1 (NCCL)
and np=2 and 3 sharing the GPU (host staging). "offload" keeps the shards, gradients and Adam's
state in host memory and computes on the GPU, and must train as the plain GPU model does."""

import pytest

from tests.multirank.harness import SCRIPTS, run_job

CASES = "sgd,adam,offload,accumulate,clip,mixed_precision,evaluation,tied_sibling_units"


@pytest.mark.parametrize("np", [1, 2, 3])
def test_fully_sharded_cuda_training_matches_one_process(np):
    result = run_job(["python", str(SCRIPTS / "fully_sharded.py"), CASES], np=np,
                     env={"FULLY_SHARDED_DEVICE": "cuda"}, timeout=300)
    assert result.returncode == 0, result.output
    for rank in range(np):
        for case in CASES.split(","):
            assert f"ok {case}" in result.lines(rank), result.output
