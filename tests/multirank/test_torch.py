"""hvdlite.torch on real ranks: training equivalence, gradients of every op, the optimizer's API.

The collectives themselves run through the shared body in test_collectives.py (framework=torch).
"""

import pytest

from .harness import run_script, shared_script

pytestmark = pytest.mark.multirank
EQUIVALENCE = [
    "sgd passes=1 compression=none groups=None compiled=False",
    "sgd passes=2 compression=none groups=None compiled=False",
    "adam passes=1 compression=none groups=None compiled=False",
    "adam passes=2 compression=none groups=None compiled=False",
    "sgd passes=1 compression=fp16 groups=None compiled=False",
    "adam passes=2 compression=bf16 groups=None compiled=False",
    "sgd passes=1 compression=none groups=2 compiled=False",
    "adam passes=1 compression=none groups=None compiled=True",
]


def _ok_lines(result, rank):
    return [line for line in result.lines(rank) if line.startswith("ok ")]


@pytest.mark.quick
@pytest.mark.parametrize("np", [2, 3])
def test_training_matches_one_process_on_the_whole_batch(np):
    result = run_script("torch_training.py", np, "equivalence", timeout=240)
    for rank in range(np):
        got = [line.split(" max diff")[0].removeprefix("ok ") for line in _ok_lines(result, rank)]
        assert got == EQUIVALENCE, result.output


API_CASES = ["gradients", "optimizer", "grad_scaler", "state", "sparse", "errors"]
LOCAL_SGD_RUNS = {2: "sgd,adam,sgd:overlap,sgd:sets", 3: "sgd,adam,sgd:overlap,adam:sets"}
EXAMPLES = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples"
SYNTHETIC_BENCHMARK = (f"{EXAMPLES / 'torch_synthetic_benchmark.py'} --model mlp --fp16-allreduce --num-iters 2 "
                       "--num-batches-per-iter 2 --num-warmup-batches 1")
# Every script of this file but the equivalence job (the quick subset's) and the example's checkpoint
# pair shares one job per size (together.py), so torch starts once per rank for all of them.
TOGETHER = {np: ("HVDLITE_BUCKET_BYTES=256 torch_training.py buckets", "torch_sparse.py", "torch_sync_batch_norm.py",
                 "torch_powersgd.py", f"HVDLITE_BUCKET_BYTES=64 torch_sharded.py {kind}", "torch_elastic_state.py",
                 f"torch_api.py {','.join(API_CASES)}", f"torch_local_sgd.py {LOCAL_SGD_RUNS[np]}", "torch_digits.py",
                 *extra)
            for np, kind, extra in ((2, "sgd", (SYNTHETIC_BENCHMARK,)), (3, "adam", ()))}


def _together(np: int):
    return shared_script("together.py", np, *TOGETHER[np], timeout=600)


@pytest.mark.parametrize("np", [2, 3])
def test_gradient_buckets_train_like_one_process(np):
    """After the first step, gradients go in buckets (here 256 bytes: several, of two dtypes)."""
    result = _together(np)
    for rank in range(np):
        assert [line.split(" [")[0] for line in _ok_lines(result, rank)].count("ok buckets") == 1, result.output


SPARSE = ["rows change under one name", "different rows per rank sparse_as_dense=False",
          "different rows per rank sparse_as_dense=True", "sparseadam passes=1 groups=None", "sparseadam passes=2 groups=None",
          "sparseadam passes=1 groups=1", "sgd passes=1 groups=1", "sgd passes=2 groups=None", "dense passes=1 groups=None", "dense passes=2 groups=1",
          "no rank uses the embedding"]


@pytest.mark.parametrize("np", [2, 3])
def test_sparse_gradients_reach_the_optimizer_sparse_and_train_like_one_process(np):
    """nn.Embedding(sparse=True) + SparseAdam (or SGD; or Adam with sparse_as_dense), with a dense
    head, against one process on the whole batch: every step's gradients (the embedding's sparse on
    every rank), then the weights; with backward_passes_per_step=2, groups, a rank that skipped the
    embedding, and on a process set of all ranks but the last (Average divides by its size). First,
    an allgather whose row counts change under one name (the response cache must not reuse sizes)."""
    result = _together(np)
    subset = f"sparseadam passes=2 groups=None process_set={list(range(np - 1))}"
    for rank in range(np):
        want = SPARSE + ([subset] if rank < np - 1 else [])
        got = [line for line in _ok_lines(result, rank) if line.removeprefix("ok ") in {*SPARSE, subset}]
        assert got == [f"ok {case}" for case in want], result.output


@pytest.mark.parametrize("case", API_CASES)
@pytest.mark.parametrize("np", [2, 3])
def test_torch_api(np, case):
    result = _together(np)
    for rank in range(np):
        assert f"ok {case}" in _ok_lines(result, rank), result.output


def test_synthetic_benchmark_example_prints_horovods_lines():
    result = _together(2)
    lines = result.lines(0)
    assert any(line.startswith("Img/sec per CPU: ") for line in lines), result.output
    assert any(line.startswith("Total img/sec on 2 CPU(s): ") for line in lines), result.output
    assert not [line for line in result.lines(1) if "img/sec" in line.lower()], "only rank 0 prints"


def test_training_example_learns_and_resumes_from_its_checkpoint(tmp_path):
    first = run_script(str(EXAMPLES / "torch_train.py"), 2, "--epochs", "1", "--checkpoint-dir", str(tmp_path))
    resumed = run_script(str(EXAMPLES / "torch_train.py"), 3, "--epochs", "2", "--checkpoint-dir", str(tmp_path))
    assert list(tmp_path.iterdir()), first.output
    lines = resumed.lines(0)
    assert any(line.endswith("resumed from epoch 1") for line in lines), resumed.output
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in epochs] == ["epoch 2/2"], resumed.output
    val_accuracy = float(epochs[-1].rsplit(" acc ", 1)[1])
    assert val_accuracy > 0.6, f"4 classes, chance is 0.25; got {val_accuracy}\n{resumed.output}"


@pytest.mark.parametrize("np", [2, 3])
def test_sync_batch_norm_equals_batch_norm_on_the_whole_batch(np):
    result = _together(np)
    for rank in range(np):
        assert "ok sync batch norm" in result.lines(rank), result.output


@pytest.mark.parametrize("np", [2, 3])
def test_elastic_state_commits_restores_and_syncs_and_the_sampler_resumes_an_epoch(np):
    result = _together(np)
    for rank in range(np):
        assert "ok elastic state" in result.lines(rank), result.output


# torch_local_sgd.py runs every local SGD case in turn; each test checks its own.
def _local_sgd_ok(np: int, kind: str, mode: str) -> None:
    result = _together(np)
    assert result.output.count(f"ok local sgd {kind} {mode} ") == np, result.output


@pytest.mark.parametrize("np", [2, 3])
@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_local_sgd_steps_locally_and_averages_every_period_like_its_replay(np, kind):
    _local_sgd_ok(np, kind, "plain")


@pytest.mark.parametrize("np", [2, 3])
def test_overlapped_local_sgd_lands_each_average_one_period_late_like_its_replay(np):
    _local_sgd_ok(np, "sgd", "overlap")


@pytest.mark.parametrize(("np", "kind"), [(2, "sgd"), (3, "adam")])
def test_local_sgd_averages_inside_each_process_set_with_two_backward_passes_per_step(np, kind):
    _local_sgd_ok(np, kind, "sets")


@pytest.mark.parametrize(("np", "kind"), [(2, "sgd"), (3, "adam")])
def test_sharded_optimizer_state_steps_like_the_unsharded_optimizer_and_checkpoints_in_full(np, kind):
    # 64-byte buckets: the 7-5-1 MLP spans several buckets, none divisible by 3
    assert f"torch_sharded.py {kind}" in " ".join(TOGETHER[np])
    result = _together(np)
    assert result.output.count("ok torch sharded") == np, result.output


@pytest.mark.parametrize("np", [2, 3])
def test_powersgd_gradients_agree_bit_for_bit_and_match_their_replay(np):
    result = _together(np)
    assert result.output.count("ok torch powersgd") == np, result.output


@pytest.mark.parametrize("np", [2, 3])
def test_sharded_local_sgd_and_powersgd_reach_the_synchronous_accuracy_on_digits(np):
    result = _together(np)
    assert result.output.count("ok digits") == np, result.output
    accuracy = {mode: float(value) for mode, value in
                (line.split()[1:3] for line in result.lines(0) if line.startswith("accuracy "))}
    assert set(accuracy) == {"sync", "sharded", "local4", "local8", "local8overlap", "powersgd2", "powersgd4"}, result.output
    assert accuracy["sync"] > 90, accuracy  # the synchronous run itself learned the digits
    behind = {mode: accuracy["sync"] - value for mode, value in accuracy.items() if accuracy["sync"] - value > 1.0}
    assert not behind, f"more than 1 point below synchronous training: {behind}; all: {accuracy}"
