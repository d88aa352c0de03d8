"""hvdlite.jax on real ranks: training equivalence (eager, jit, chain, MultiSteps, accumulation),
the jit-only rules, state, sharding, optimizer options, errors, and the example."""

from pathlib import Path

import pytest

from .jax_job import API, EXAMPLE_COMMAND, LOCAL_SGD, SHARDED, TRAINING

pytestmark = pytest.mark.multirank
# Every script of this file runs in the JAX job that several files share (jax_job.py, through the
# jax_job fixture), so JAX and optax start once per rank.


def _ok_lines(result, rank, wanted):
    return [line.split(" max diff")[0] for line in result.lines(rank)
            if line.startswith("ok ") and line.split(" max diff")[0] in wanted]


@pytest.mark.parametrize("np", [2, 3])
def test_training_matches_one_process_on_the_whole_batch(np, jax_job):
    result = jax_job(np)
    want = [f"ok {case}" for case in TRAINING]
    for rank in range(np):
        assert _ok_lines(result, rank, want) == want, result.output


@pytest.mark.parametrize("np", [2, 3])
def test_api(np, jax_job):
    result = jax_job(np)
    want = [f"ok {case}" for case in API]
    for rank in range(np):
        assert _ok_lines(result, rank, want) == want, result.output


def test_example_trains_and_checkpoints(jax_job):
    result = jax_job(2)
    command = EXAMPLE_COMMAND.format(state_dir=jax_job.state_dir)
    assert (Path(jax_job.state_dir) / "ckpt.npz").exists(), result.output
    losses = [float(line.split("loss ")[1].split()[0]) for line in result.command_lines(0, command)
              if line.startswith("epoch ")]
    assert len(losses) == 2 and losses[1] < losses[0], result.output
    assert not [line for line in result.command_lines(1, command) if line.startswith("epoch ")]  # rank 0 reports


@pytest.mark.parametrize(("np", "kind", "mode"), [(2, "sgd", "jit"), (3, "adam", "jit"), (2, "adam", "eager"),
                                                  (3, "sgd", "eager")])
def test_local_sgd_updates_locally_and_averages_every_period_like_its_replay(np, kind, mode, jax_job):
    assert (kind, mode) in LOCAL_SGD[np]
    result = jax_job(np)
    assert sum(f"ok jax local sgd {kind} {mode} {rank}" in result.lines(rank) for rank in range(np)) == np, result.output


@pytest.mark.parametrize(("np", "kind", "mode"), [(2, "sgd", "eager"), (3, "adam", "jit")])
def test_local_sgd_averages_inside_each_process_set_with_two_micro_batches_per_step(np, kind, mode, jax_job):
    assert (kind, mode, "sets") in LOCAL_SGD[np]
    result = jax_job(np)
    assert sum(f"ok jax local sgd {kind} {mode} sets {rank}" in result.lines(rank) for rank in range(np)) == np, \
        result.output


@pytest.mark.parametrize(("np", "kind", "mode"), [(2, "adam", "eager"), (3, "adam", "jit"), (3, "sgd", "jit")])
def test_sharded_optimizer_state_matches_the_unsharded_wrapper_with_1_over_n_of_the_state(np, kind, mode, jax_job):
    assert (kind, mode) in SHARDED[np]
    result = jax_job(np)
    assert sum(f"ok jax sharded {kind} {mode} {rank}" in result.lines(rank) for rank in range(np)) == np, result.output


@pytest.mark.parametrize("np", [2, 3])
def test_powersgd_updates_agree_bit_for_bit_and_match_their_replay_eager_and_jitted(np, jax_job):
    result = jax_job(np)
    for mode in ("eager", "jit"):
        assert result.output.count(f"ok jax powersgd {mode}") == np, result.output
