"""hvdlite.jax on real ranks: training equivalence (eager, jit, chain, MultiSteps, accumulation),
the jit-only rules, state, sharding, optimizer options, errors, and the example."""

import pytest

from .harness import run_job, shared_script

pytestmark = pytest.mark.multirank
TRAINING = ["host", "jit", "chain", "multisteps", "accumulate", "accumulate-jit"]
API = ["pytrees", "errors", "state", "sharding", "optimizer_options"]
# Every script of this file at one size shares one job (together.py), so JAX and optax start once per
# rank; the runs of jax_local_sgd.py ("KIND MODE [sets]") and jax_sharded.py ("KIND MODE") by size.
LOCAL_SGD = {2: [("sgd", "jit"), ("adam", "eager"), ("sgd", "eager", "sets")],
             3: [("adam", "jit"), ("sgd", "eager"), ("adam", "jit", "sets")]}
SHARDED = {2: [("adam", "eager")], 3: [("adam", "jit"), ("sgd", "jit")]}


def _together(np: int):
    commands = [f"jax_training.py {','.join(TRAINING)}", f"jax_api.py {','.join(API)}",
                *(f"jax_local_sgd.py {' '.join(run)}" for run in LOCAL_SGD[np]),
                *(f"jax_sharded.py {' '.join(run)}" for run in SHARDED[np]), "jax_powersgd.py eager,jit"]
    return shared_script("together.py", np, *commands, env={"JAX_PLATFORMS": "cpu"}, timeout=300)


def _ok_lines(result, rank, wanted):
    return [line.split(" max diff")[0] for line in result.lines(rank)
            if line.startswith("ok ") and line.split(" max diff")[0] in wanted]


@pytest.mark.parametrize("np", [2, 3])
def test_training_matches_one_process_on_the_whole_batch(np):
    result = _together(np)
    want = [f"ok {case}" for case in TRAINING]
    for rank in range(np):
        assert _ok_lines(result, rank, want) == want, result.output


@pytest.mark.parametrize("np", [2, 3])
def test_api(np):
    result = _together(np)
    want = [f"ok {case}" for case in API]
    for rank in range(np):
        assert _ok_lines(result, rank, want) == want, result.output


def test_example_trains_and_checkpoints(tmp_path):
    result = run_job(["python", "examples/jax_train.py", "--epochs", "2", "--checkpoint", str(tmp_path / "ckpt.npz")],
                     np=2, timeout=180)
    assert result.returncode == 0, result.output
    assert (tmp_path / "ckpt.npz").exists()
    losses = [float(line.split("loss ")[1].split()[0]) for line in result.lines(0) if line.startswith("epoch ")]
    assert len(losses) == 2 and losses[1] < losses[0], result.output
    assert not [line for line in result.lines(1) if line.startswith("epoch ")]  # rank 0 reports


@pytest.mark.parametrize(("np", "kind", "mode"), [(2, "sgd", "jit"), (3, "adam", "jit"), (2, "adam", "eager"),
                                                  (3, "sgd", "eager")])
def test_local_sgd_updates_locally_and_averages_every_period_like_its_replay(np, kind, mode):
    assert (kind, mode) in LOCAL_SGD[np]
    result = _together(np)
    assert sum(f"ok jax local sgd {kind} {mode} {rank}" in result.lines(rank) for rank in range(np)) == np, result.output


@pytest.mark.parametrize(("np", "kind", "mode"), [(2, "sgd", "eager"), (3, "adam", "jit")])
def test_local_sgd_averages_inside_each_process_set_with_two_micro_batches_per_step(np, kind, mode):
    assert (kind, mode, "sets") in LOCAL_SGD[np]
    result = _together(np)
    assert sum(f"ok jax local sgd {kind} {mode} sets {rank}" in result.lines(rank) for rank in range(np)) == np, \
        result.output


@pytest.mark.parametrize(("np", "kind", "mode"), [(2, "adam", "eager"), (3, "adam", "jit"), (3, "sgd", "jit")])
def test_sharded_optimizer_state_matches_the_unsharded_wrapper_with_1_over_n_of_the_state(np, kind, mode):
    assert (kind, mode) in SHARDED[np]
    result = _together(np)
    assert sum(f"ok jax sharded {kind} {mode} {rank}" in result.lines(rank) for rank in range(np)) == np, result.output


@pytest.mark.parametrize("np", [2, 3])
def test_powersgd_updates_agree_bit_for_bit_and_match_their_replay_eager_and_jitted(np):
    result = _together(np)
    for mode in ("eager", "jit"):
        assert result.output.count(f"ok jax powersgd {mode}") == np, result.output
