"""torch's own tools on hvd.fully_shard's parameters, with real ranks: each was a silent local answer
while the shards were plain tensors (a shard's norm, a shard's rows as the whole state dict)."""

from pathlib import Path

import pytest

from .harness import CheckpointAcrossSizes, checkpoint_across_sizes, run_script

pytestmark = pytest.mark.multirank
CASES = ["clip", "model_state_dict", "optimizer_state_dict", "full_tensor", "unshard", "collectives_refuse"]


def _commands(save: Path | None, load: Path | None) -> list[str]:
    """One command a job: every case first after ``device_mesh`` (which must start the default group)
    and a DCP checkpoint saved where a job saves one; the other size's loaded where it loads one
    (harness.CheckpointAcrossSizes)."""
    cases = [*(["device_mesh", *CASES, f"dcp_save={save}"] if save else []), *([f"dcp_load={load}"] if load else [])]
    return [f"fully_sharded_torch_apis.py {','.join(cases)}"]


@pytest.fixture(scope="session")
def jobs(tmp_path_factory) -> CheckpointAcrossSizes:
    """``jobs(0)``: np=2, ``jobs(1)``: np=3, ``jobs(2)``: np=2 loading np=3's checkpoint."""
    return checkpoint_across_sizes(tmp_path_factory.mktemp("dcp_checkpoints"), _commands)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("np", [2, 3])
def test_torch_tools_on_fully_sharded_parameters_give_the_one_process_answers(np, case, jobs):
    result = jobs(np - 2)
    for rank in range(np):
        assert f"ok {case}" in result.lines(rank), result.output


@pytest.mark.parametrize("np", [2, 3])
def test_init_device_mesh_after_hvd_init_alone_is_on_hvdlite(np, jobs):
    result = jobs(np - 2)  # device_mesh is the job's first case
    assert result.returncode == 0 and result.output.count("ok device_mesh") == np, result.output


def test_hybrid_sharding_parameters_live_on_a_two_dimensional_mesh():
    result = run_script("fully_sharded_torch_apis.py", 4, "hybrid", timeout=120)
    assert result.returncode == 0 and result.output.count("ok hybrid") == 4, result.output


@pytest.mark.parametrize(("saved_at", "loaded_at"), [(2, 3), (3, 2)])
def test_a_dcp_checkpoint_of_shards_loads_at_another_size_into_either_fully_shard_and_back(saved_at, loaded_at, jobs):
    saved = jobs(saved_at - 2)
    assert saved.returncode == 0 and saved.output.count("ok dcp_save") == saved_at, saved.output
    loaded = jobs(1 if loaded_at == 3 else 2)
    assert loaded.returncode == 0 and loaded.output.count("ok dcp_load") == loaded_at, loaded.output
