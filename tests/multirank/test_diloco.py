"""DiLoCo through the real launcher (torch, JAX, Keras): every rank's parameters equal a one-process replay after every step.

One job per layout runs every case in turn (torch_diloco.py); each test checks its own case.
"""

from collections.abc import Callable

import pytest

from .harness import SCRIPTS, JobResult, run_job, shared_jobs_in_order, shared_script
from .tensorflow_job import KERAS_DILOCO_FIT_RUNS

# np=4 in two groups of two (a DistributedOptimizer, or fully_shard, inside each group; pseudo-gradients
# averaged between the ranks holding the same place in each group); np=3 in groups of one.
RUNS = {(4, 2): "refusals,plain,sharded,plain/2/1,sharded/2/1,plain/2/0/int8,plain/1/0/bf16,wide/2/1/int8",
        (3, 1): "refusals,plain,plain/2/1/int8,plain/2/1/bf16"}
# The torch scripts at np=4 and np=3 share one job per size (together.py: torch starts once per rank):
# the np=4 job saves the checkpoint that the np=3 job loads ({checkpoint}).
TORCH_JOBS = {4: (f"torch_diloco.py 2 {RUNS[(4, 2)]}", "torch_diloco_digits.py 2", "torch_diloco_resize.py save {checkpoint}"),
              3: (f"torch_diloco.py 1 {RUNS[(3, 1)]}", "torch_diloco_resize.py load {checkpoint}")}


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("diloco") / "diloco.pt")


@pytest.fixture(scope="session")
def torch_job(checkpoint) -> Callable[[int], JobResult]:
    """``torch_job(np)``: the shared torch job at ``np`` (4 or 3) ranks; the np=3 one after the np=4 one."""
    jobs = [(np, [command.format(checkpoint=checkpoint) for command in TORCH_JOBS[np]]) for np in (4, 3)]
    return lambda np: shared_jobs_in_order(jobs, 0 if np == 4 else 1)  # np=4 saves the checkpoint np=3 loads


def _diloco_ok(torch_job: Callable[[int], JobResult], np: int, run: str) -> None:
    result = torch_job(np)
    assert result.output.count(f"ok diloco {run} ") == np, result.output


@pytest.mark.parametrize(("np", "group_size"), [(4, 2), (3, 1)])
def test_diloco_steps_every_rank_like_its_replay_and_resumes_from_a_checkpoint(np, group_size, torch_job):
    _diloco_ok(torch_job, np, "plain")


def test_diloco_over_groups_that_fully_shard_the_model_exchanges_each_ranks_shard_like_the_replay(torch_job):
    _diloco_ok(torch_job, 4, "sharded")


@pytest.mark.parametrize(("np", "group_size", "run"), [(4, 2, "plain/2/1"), (4, 2, "sharded/2/1"),
                                                       (3, 1, "plain/2/1/int8")])
def test_streaming_diloco_lands_each_fragment_delay_steps_late_keeping_local_progress(np, group_size, run, torch_job):
    _diloco_ok(torch_job, np, run)


@pytest.mark.parametrize(("np", "group_size", "run"), [(4, 2, "plain/2/0/int8"), (4, 2, "plain/1/0/bf16"),
                                                       (3, 1, "plain/2/1/bf16"), (4, 2, "wide/2/1/int8")])
def test_compressed_diloco_averages_what_the_codec_delivers_with_error_feedback(np, group_size, run, torch_job):
    _diloco_ok(torch_job, np, run)


@pytest.mark.parametrize(("np", "group_size"), [(4, 2), (3, 1)])
def test_diloco_refuses_local_sgd_inside_a_distributed_outer_optimizer_disagreeing_ranks_and_non_members(np, group_size,
                                                                                                        torch_job):
    _diloco_ok(torch_job, np, "refusals")


def test_diloco_with_h16_reaches_synchronous_accuracy_on_digits_in_two_groups_of_two(torch_job):
    result = torch_job(4)
    assert result.output.count("ok diloco digits") == 4, result.output
    accuracy = {mode: float(value) for mode, value in
                (line.split()[1:3] for line in result.lines(0) if line.startswith("accuracy "))}
    assert set(accuracy) == {"sync", "diloco", "diloco_f4", "diloco_bf16", "diloco_int8", "diloco_f4_int8"}, accuracy
    assert accuracy["sync"] > 90, accuracy  # the synchronous run itself learned the digits
    behind = {mode: accuracy["sync"] - value for mode, value in accuracy.items() if accuracy["sync"] - value > 1.0}
    assert not behind, f"more than 1 point below synchronous training: {behind}; all: {accuracy}"


# JAX (optax): np=4 in two groups of two under jax.jit, np=3 in groups of one eagerly (jax_diloco.py); bf16 at
# np=3 only (the codec is the shared NumPy one, checked bit for bit in tests/unit/test_diloco_parts.py).
JAX_RUNS = {(4, 2, "jit"): "refusals,1/0,2/1,2/1/int8", (3, 1, "eager"): "refusals,1/0,2/1/int8,2/1/bf16"}


@pytest.mark.parametrize(("np", "group_size", "mode", "run"),
                         [(np, group_size, mode, run) for (np, group_size, mode), runs in JAX_RUNS.items()
                          for run in runs.split(",")])
def test_jax_diloco_steps_every_rank_like_its_replay_and_resumes_from_a_checkpoint(np, group_size, mode, run):
    result = shared_script("jax_diloco.py", np, str(group_size), mode, JAX_RUNS[(np, group_size, mode)], timeout=240)
    assert result.output.count(f"ok jax diloco {run} ") == np, result.output


# Keras 3: np=4 in two groups of two through an eager loop, np=3 in groups of one through model.fit
# (keras_diloco.py; np=3 in the TensorFlow job several files share, tensorflow_job.py).
KERAS_EAGER_RUNS = "refusals,1/0,2/1,2/1/int8"


@pytest.mark.parametrize("run", KERAS_EAGER_RUNS.split(","))
def test_keras_diloco_in_groups_of_two_steps_every_rank_like_its_replay_and_resumes_from_a_checkpoint(run):
    result = shared_script("keras_diloco.py", 4, "2", "eager", KERAS_EAGER_RUNS, timeout=240)
    assert result.output.count(f"ok keras diloco {run} ") == 4, result.output


@pytest.mark.parametrize("run", KERAS_DILOCO_FIT_RUNS.split(","))
def test_keras_diloco_through_fit_steps_every_rank_like_its_replay_and_resumes_from_a_checkpoint(run, tensorflow_job):
    result = tensorflow_job(3)
    assert result.output.count(f"ok keras diloco {run} ") == 3, result.output


@pytest.mark.parametrize(("script", "np", "group_size", "ok"), [
    ("torch_diloco_elastic.py", 4, 2, "ok diloco elastic"),  # two groups of two: group 1 dies
    ("jax_diloco_elastic.py", 3, 1, "ok jax diloco elastic"),  # three groups of one: rank 2 dies
    ("keras_diloco_elastic.py", 3, 1, "ok keras diloco elastic")])
def test_elastic_diloco_trains_on_when_a_group_dies_and_gives_a_joining_group_the_outer_state(script, np, group_size,
                                                                                              ok):
    # The last group is killed, the others train on, new ranks refill the slots after the host's
    # cooldown; every rank's parameters end equal to the replay of the sizes.
    dead = list(range(np - group_size, np))
    result = run_job(["--min-np", "2", "--blacklist-cooldown-range", "0.5", "1", "python", str(SCRIPTS / script),
                      str(group_size), str(np)], np=np, timeout=240)
    assert result.returncode == 0, result.output
    assert f"the job went on without rank(s) {dead} and finished" in result.output, result.output
    assert f"starting {group_size} new rank(s)" in result.output, result.output
    assert f"admitted {group_size} new rank(s)" in result.output, result.output  # the group joins whole
    assert all(f"{ok} {rank} [{np - group_size}, {np}]" in result.output for rank in range(np)), result.output


def test_a_diloco_checkpoint_saved_at_np_4_resumes_at_np_2_and_3_like_the_replay(torch_job, checkpoint):
    saved = torch_job(4)
    assert saved.output.count("ok diloco resize save ") == 4, saved.output
    loaded = torch_job(3)
    assert loaded.output.count("ok diloco resize load ") == 3, loaded.output
    loaded = run_job(["python", str(SCRIPTS / "torch_diloco_resize.py"), "load", checkpoint], np=2, timeout=180)
    assert loaded.returncode == 0 and loaded.output.count("ok diloco resize load ") == 2, loaded.output
