"""torch's own tools on hvd.fully_shard's parameters, with real ranks: each was a silent local answer
while the shards were plain tensors (a shard's norm, a shard's rows as the whole state dict)."""

import dataclasses
from pathlib import Path

import pytest

from .harness import JobResult, run_script, shared_jobs_in_order

pytestmark = pytest.mark.multirank
CASES = ["clip", "model_state_dict", "optimizer_state_dict", "full_tensor", "unshard", "collectives_refuse"]


@dataclasses.dataclass(frozen=True)
class Jobs:
    """``jobs(index)``: one of three jobs that run in order, every case first after ``device_mesh``
    (which must start the default group): at np=2, saving a DCP checkpoint; at np=3, saving one and
    loading np=2's; at np=2, loading np=3's."""

    folder: Path  # the checkpoints: at2/, at3/

    def cases(self, index: int) -> str:
        every = ["device_mesh", *CASES]
        return ",".join([[*every, f"dcp_save={self.folder / 'at2'}"],
                         [*every, f"dcp_save={self.folder / 'at3'}", f"dcp_load={self.folder / 'at2'}"],
                         [f"dcp_load={self.folder / 'at3'}"]][index])

    def __call__(self, index: int) -> JobResult:
        order = [(np, [f"fully_sharded_torch_apis.py {self.cases(position)}"]) for position, np in enumerate((2, 3, 2))]
        return shared_jobs_in_order(order, index, timeout=240)


@pytest.fixture(scope="session")
def jobs(tmp_path_factory) -> Jobs:
    folder = tmp_path_factory.mktemp("dcp_checkpoints")
    for np in (2, 3):
        (folder / f"at{np}").mkdir()
    return Jobs(folder)


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
