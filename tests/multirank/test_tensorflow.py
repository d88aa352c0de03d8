"""hvdlite.tensorflow and hvdlite.tensorflow.keras on real ranks: training equivalence, gradients,
callbacks, state, errors. The collectives themselves run through the shared body in
test_collectives.py (framework=tensorflow and tensorflow-graph)."""

from pathlib import Path

import pytest

from .tensorflow_job import API_CASES, KERAS_EXAMPLE

pytestmark = pytest.mark.multirank
FIT_CASES = ["sgd", "adam clipnorm", "adam global_clipnorm", "sgd momentum predivide", "loss scale",
             "gradient_accumulation_steps=2", "backward_passes_per_step=2"]
TAPE_CASES = ["gradient tape compiled=False", "gradient tape compiled=True"]


def _ok_lines(result, rank):
    return [line.split(" max diff")[0].removeprefix("ok ") for line in result.lines(rank) if line.startswith("ok ")]


# Every script of this file runs in the TensorFlow job that several files share (tensorflow_job.py,
# through the tensorflow_job fixture).
COMPAT_CASES = ["graph_without_dependencies", "uint16", "error_types", "broadcast_inplace", "mixed_dense_and_sparse",
                "signatures", "broadcast_grad", "graph_divergence"]


@pytest.mark.parametrize("np", [2, 3])
@pytest.mark.parametrize("loop, cases", [("fit", FIT_CASES), ("tape", TAPE_CASES)])
def test_training_matches_one_process_on_the_whole_batch(np, loop, cases, tensorflow_job):
    result = tensorflow_job(np)
    for rank in range(np):
        assert [case for case in _ok_lines(result, rank) if case in cases] == cases, result.output


@pytest.mark.parametrize("np", [2, 3])
def test_tensorflow_api(np, tensorflow_job):
    result = tensorflow_job(np)
    for rank in range(np):
        assert [case for case in _ok_lines(result, rank) if case in API_CASES] == API_CASES, result.output


def test_saved_model_loads_back_with_and_without_hvdlite(tensorflow_job):
    result = tensorflow_job(2)
    for rank in range(2):
        assert "state" in _ok_lines(result, rank), result.output


def test_synthetic_benchmark_example_prints_horovods_lines(tensorflow_job):
    result = tensorflow_job(2)
    lines = result.lines(0)
    assert any(line.startswith("Img/sec per CPU: ") for line in lines), result.output
    assert any(line.startswith("Total img/sec on 2 CPU(s): ") for line in lines), result.output
    assert not [line for line in result.lines(1) if "img/sec" in line.lower()], "only rank 0 prints"


def test_keras_example_learns_and_resumes_from_its_checkpoint(tensorflow_job):
    # one epoch at np=2 from scratch, then the second at np=3 from its checkpoint (tensorflow_job.py)
    first, resumed = tensorflow_job(2), tensorflow_job(3)
    lines = {np: job.command_lines(0, KERAS_EXAMPLE[np].format(state_dir=tensorflow_job.state_dir))
             for np, job in ((2, first), (3, resumed))}
    assert [line.split(":")[0] for line in lines[2] if line.startswith(("epoch ", "resumed "))] == ["epoch 1/1"], \
        first.output
    assert "resumed from epoch 1" in lines[3], resumed.output
    epochs = [line for line in lines[3] if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in epochs] == ["epoch 2/2"], resumed.output
    val_accuracy = float(epochs[-1].rsplit(" val acc ", 1)[1])
    assert val_accuracy > 0.6, f"4 classes, chance is 0.25; got {val_accuracy}\n{resumed.output}"
    saved = sorted(path.name for path in (Path(tensorflow_job.state_dir) / "keras_example").iterdir())
    assert saved == ["checkpoint-1.keras", "checkpoint-2.keras"], saved


@pytest.mark.parametrize("np", [2, 3])
def test_places_where_horovod_tensorflow_behaved_differently(np, tensorflow_job):
    result = tensorflow_job(np)
    for rank in range(np):
        assert [case for case in _ok_lines(result, rank) if case in COMPAT_CASES] == COMPAT_CASES, result.output


@pytest.mark.parametrize("np", [2, 3])
def test_sync_batch_normalization_equals_batch_normalization_on_the_whole_batch(np, tensorflow_job):
    result = tensorflow_job(np)
    for rank in range(np):
        assert "ok tf sync batch norm" in result.lines(rank), result.output


@pytest.mark.parametrize(("np", "mode"), [(2, "global"), (3, "sets")])
def test_tf1_graph_trains_with_the_distributed_v1_optimizer_and_the_broadcast_hook(np, mode, tensorflow_job):
    result = tensorflow_job(np)
    for rank in range(np):
        assert f"ok tf1 training {mode}" in result.lines(rank), result.output


def test_partial_distributed_optimizer_keeps_the_local_layers_gradients_local(tensorflow_job):
    result = tensorflow_job(2)
    for rank in range(2):
        assert "ok keras partial" in result.lines(rank), result.output


@pytest.mark.parametrize(("np", "kind", "mode"), [(2, "adam", "fit"), (3, "sgd", "eager"), (3, "adam", "fit")])
def test_keras_local_sgd_updates_locally_and_averages_every_period_like_its_replay(np, kind, mode, tensorflow_job):
    result = tensorflow_job(np)
    assert result.output.count(f"ok keras local sgd {kind} {mode} ") == np, result.output

