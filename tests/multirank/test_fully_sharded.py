"""fully_shard with real ranks: the same parameters as one process on the whole batch, case by case."""

import re
from pathlib import Path

import pytest

from .harness import SCRIPTS, CheckpointAcrossSizes, checkpoint_across_sizes, run_job, run_script, shared_script

pytestmark = pytest.mark.multirank
CASES = ["sgd", "adam", "offload", "keep_after_forward", "prefetch_off", "accumulate", "accumulate_no_sync", "clip",
         "mixed_precision", "mixed_precision_bf16_reduce", "hybrid",
         "distributed_optimizer", "frozen", "evaluation", "activation_checkpointing", "checkpoint", "memory", "refusals",
         "tied_in_one_unit", "tied_embedding_unit", "tied_head_unit", "tied_sibling_units", "tied_without_a_common_unit",
         "mixed_dtypes", "hidden_outputs", "copies"]


def _commands(save: Path | None, load: Path | None) -> list[str]:
    """Every case (each builds its own models) and a sharded checkpoint saved where a job saves one;
    the checkpoint of the other size loaded where it loads one (harness.CheckpointAcrossSizes)."""
    return [*([f"fully_sharded.py {','.join(CASES)},save_sharded {save}"] if save else []),
            *([f"fully_sharded.py load_sharded {load}"] if load else [])]


@pytest.fixture(scope="session")
def jobs(tmp_path_factory) -> CheckpointAcrossSizes:
    """``jobs(0)``: np=2, ``jobs(1)``: np=3, ``jobs(2)``: np=2 loading np=3's checkpoint."""
    return checkpoint_across_sizes(tmp_path_factory.mktemp("sharded_checkpoints"), _commands)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("np", [2, 3])
def test_fully_sharded_training_matches_one_process(np, case, jobs):
    result = jobs(np - 2)
    for rank in range(np):
        assert f"ok {case}" in result.lines(rank), result.output


@pytest.mark.parametrize("case", ["hybrid", "group_reshard"])
def test_pairs_of_ranks_at_np_4_train_as_one_process(case):
    # hybrid: shards within {0, 1} and {2, 3}, each shard averaged across {0, 2} and {1, 3};
    # group_reshard: reshard_after_forward=2, backward gathers within {0, 1} and {2, 3}.
    result = shared_script("fully_sharded.py", 4, "hybrid,group_reshard", timeout=120)
    assert result.output.count(f"ok {case}") == 4, result.output


def test_memory_per_rank_is_the_unsharded_state_over_n(jobs):
    result = jobs(1)  # np=3
    held, unsharded = map(int, re.search(r"model state (\d+) bytes per rank, unsharded (\d+)", result.output).groups())
    assert held <= 1.05 * unsharded / 3, result.output  # the units are too small here to need their allowance


@pytest.mark.parametrize("np", [2, 3])
def test_ranks_whose_forwards_differ_get_an_error_naming_the_unit_and_the_ranks(np):
    result = run_script("fully_sharded.py", np, "diverge", timeout=90,
                        env={"HVDLITE_STALL_CHECK_TIME_SECONDS": "1", "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "3"})
    others = [0, *range(2, np)]
    # Rank 1 skips block 1: the others wait in block 1's all-gather, rank 1 in block 2's. The error
    # names the collective that waited longest, which on a busy machine can be either.
    stalls = [("fully_shard.blocks.1.allgather", others, [1]), ("fully_shard.blocks.2.allgather", [1], others)]
    for rank in range(np):
        caught = [line for line in result.lines(rank) if line.startswith("caught StallError")]
        assert caught, result.output
        assert any(f"tensor '{name}' (allgather) waited" in caught[0]
                   and f"submitted by rank(s) {by}, missing on rank(s) {missing}" in caught[0]
                   for name, by, missing in stalls), caught[0]


@pytest.mark.parametrize(("saved_at", "loaded_at"), [(3, 2), (2, 3)])
def test_a_sharded_checkpoint_loads_at_another_world_size(saved_at, loaded_at, jobs):
    # Each rank writes its rows (and its rows of Adam's state); the other size reads them back and
    # must gather the very tensors the saving job gathered, then train on.
    saved, folder = jobs(saved_at - 2), jobs.folder / f"at{saved_at}"
    assert [line for rank in range(saved_at) for line in saved.command_lines(rank, jobs.job_commands(saved_at - 2)[0])
            if line == "ok save_sharded"] == ["ok save_sharded"] * saved_at, saved.output
    files = ["expected.pt", "layout.json", *[f"rank-{r}.pt" for r in range(saved_at)]]
    assert sorted(p.name for p in folder.iterdir()) == [*files, "tied"]  # tied: a model with a tied weight
    assert sorted(p.name for p in (folder / "tied").iterdir()) == files
    loading = 1 if loaded_at == 3 else 2  # the job, and its last command
    loaded = jobs(loading)
    assert [line for rank in range(loaded_at) for line in loaded.command_lines(rank, jobs.job_commands(loading)[-1])
            if line == "ok load_sharded"] == ["ok load_sharded"] * loaded_at, loaded.output


@pytest.mark.parametrize(("np", "victim"), [(3, 2), (3, 0), (2, 1)])
def test_survivors_of_a_killed_rank_rebuild_its_shards_and_train_on_like_one_process(np, victim):
    # Rank 0 dying is the hardest case: the new rank 0 (which syncs the rest) held none of its rows.
    result = run_job(["--min-np", str(np - 1), "python", str(SCRIPTS / "fully_sharded_elastic.py"), str(victim)],
                     np=np, timeout=240)
    assert result.returncode == 0, result.output
    assert f"the job went on without rank(s) [{victim}] and finished" in result.output, result.output
    survivors = [rank for rank in range(np) if rank != victim]  # output is labelled by launch rank
    for new_rank, rank in enumerate(survivors):
        lines = result.lines(rank)
        assert "ok fully sharded elastic" in lines and f"new rank {new_rank} size {np - 1}" in lines, result.output


def test_a_rank_that_joins_receives_its_shards_and_the_grown_job_trains_on_like_one_process(tmp_path):
    # Launched at np=2; a slot appears, the launcher starts a third rank, which joins with no commit
    # of its own: the re-shard gives it its rows (and Adam's state of them) from the others.
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:2\n")
    result = run_job(["--min-np", "2", "--host-discovery-script", f"cat {hosts}", "python",
                      str(SCRIPTS / "fully_sharded_elastic.py"), "grow", str(hosts)], np=2, timeout=240)
    assert result.returncode == 0, result.output
    assert "starting 1 new rank(s) on" in result.output and "admitted 1 new rank(s)" in result.output, result.output
    # Counted in the whole output: MPICH labels a spawned rank's lines with its index in the spawn ("[0]").
    assert result.output.count("ok fully sharded elastic") == 3, result.output
    assert sorted(re.findall(r"new rank (\d) size 3", result.output)) == ["0", "1", "2"], result.output
