"""torch's own tools on hvd.fully_shard's parameters, with real ranks: each was a silent local answer
while the shards were plain tensors (a shard's norm, a shard's rows as the whole state dict)."""

import pytest

from .harness import run_script, shared_script

pytestmark = pytest.mark.multirank
CASES = ["clip", "model_state_dict", "optimizer_state_dict", "full_tensor", "unshard", "collectives_refuse"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("np", [2, 3])
def test_torch_tools_on_fully_sharded_parameters_give_the_one_process_answers(np, case):
    result = shared_script("fully_sharded_torch_apis.py", np, ",".join(CASES))
    for rank in range(np):
        assert f"ok {case}" in result.lines(rank), result.output


@pytest.mark.parametrize("np", [2, 3])
def test_init_device_mesh_after_hvd_init_alone_is_on_hvdlite(np):
    result = run_script("fully_sharded_torch_apis.py", np, "device_mesh", timeout=120)
    assert result.returncode == 0 and result.output.count("ok device_mesh") == np, result.output


def test_hybrid_sharding_parameters_live_on_a_two_dimensional_mesh():
    result = run_script("fully_sharded_torch_apis.py", 4, "hybrid", timeout=120)
    assert result.returncode == 0 and result.output.count("ok hybrid") == 4, result.output


@pytest.mark.parametrize(("saved_at", "loaded_at"), [(2, 3), (3, 2)])
def test_a_dcp_checkpoint_of_shards_loads_at_another_size_into_either_fully_shard_and_back(tmp_path, saved_at,
                                                                                          loaded_at):
    saved = run_script("fully_sharded_torch_apis.py", saved_at, "dcp_save", str(tmp_path), timeout=120)
    assert saved.returncode == 0 and saved.output.count("ok dcp_save") == saved_at, saved.output
    loaded = run_script("fully_sharded_torch_apis.py", loaded_at, "dcp_load", str(tmp_path), timeout=120)
    assert loaded.returncode == 0 and loaded.output.count("ok dcp_load") == loaded_at, loaded.output
