"""hvdlite.jax on real ranks: training equivalence (eager, jit, chain, MultiSteps, accumulation),
the jit-only rules, state, sharding, optimizer options, errors, and the example."""

import pytest

from .harness import run_job, run_script

pytestmark = pytest.mark.multirank
TRAINING = ["host", "jit", "chain", "multisteps", "accumulate", "accumulate-jit"]
API = ["pytrees", "errors", "state", "sharding", "optimizer_options"]


@pytest.mark.parametrize("np", [2, 3])
def test_training_matches_one_process_on_the_whole_batch(np):
    result = run_script("jax_training.py", np, ",".join(TRAINING), timeout=240)
    for rank in range(np):
        assert [line.split(" max diff")[0] for line in result.lines(rank) if line.startswith("ok ")] == \
            [f"ok {case}" for case in TRAINING], result.output


@pytest.mark.parametrize("np", [2, 3])
def test_api(np):
    result = run_script("jax_api.py", np, ",".join(API), timeout=180)
    for rank in range(np):
        assert [line for line in result.lines(rank) if line.startswith("ok ")] == [f"ok {c}" for c in API], result.output


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
    result = run_script("jax_local_sgd.py", np, kind, mode, timeout=240)
    assert result.output.count("ok jax local sgd") == np, result.output


@pytest.mark.parametrize(("np", "kind", "mode"), [(2, "sgd", "eager"), (3, "adam", "jit")])
def test_local_sgd_averages_inside_each_process_set_with_two_micro_batches_per_step(np, kind, mode):
    result = run_script("jax_local_sgd.py", np, kind, mode, "sets", timeout=240)
    assert result.output.count("ok jax local sgd") == np, result.output


@pytest.mark.parametrize(("np", "kind", "mode"), [(2, "adam", "eager"), (3, "adam", "jit"), (3, "sgd", "jit")])
def test_sharded_optimizer_state_matches_the_unsharded_wrapper_with_1_over_n_of_the_state(np, kind, mode):
    result = run_script("jax_sharded.py", np, kind, mode, timeout=240)
    assert result.output.count("ok jax sharded") == np, result.output


@pytest.mark.parametrize("np", [2, 3])
def test_powersgd_updates_agree_bit_for_bit_and_match_their_replay_eager_and_jitted(np):
    result = run_script("jax_powersgd.py", np, "eager,jit", timeout=240)
    for mode in ("eager", "jit"):
        assert result.output.count(f"ok jax powersgd {mode}") == np, result.output
