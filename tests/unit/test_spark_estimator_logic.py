"""The estimators' framework-free logic, in process: labels against the model's outputs, the run's
checkpoint and history in the store, the learning rate scaled or left alone (no Spark, no ranks)."""

import numpy as np
import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from hvdlite.spark.common.params import ParamsError  # noqa: E402
from hvdlite.spark.common.prepare import Prepared  # noqa: E402
from hvdlite.spark.common.spec import DataSpec  # noqa: E402
from hvdlite.spark.common.store import Store  # noqa: E402
from hvdlite.spark.estimator import check_outputs, label_as_output, label_mismatch  # noqa: E402


def _prepared(**shapes):
    return Prepared("train", None, 10, 0, shapes)


def test_a_label_fits_an_output_with_as_many_values_per_row_or_one_class_index():
    assert label_mismatch((), (1,), "y") is None
    assert label_mismatch((2, 3), (6,), "y") is None
    assert label_mismatch((), (10,), "y") is None  # a class index against ten logits
    assert label_mismatch((2,), (3,), "y") == "label column 'y' has shape (2,) per row but the model's output for it has (3,)"
    check_outputs([(1,), (4,)], _prepared(a=(), b=(2, 2)), ["a", "b"])
    with pytest.raises(ParamsError, match="the model has 1 outputs for 2 label columns"):
        check_outputs([(1,)], _prepared(a=(), b=()), ["a", "b"])
    with pytest.raises(ParamsError, match=r"label column 'b' has shape \(3,\)"):
        check_outputs([(1,), (2,)], _prepared(a=(), b=(3,)), ["a", "b"])


def test_labels_take_their_outputs_shape_and_class_indices_stay_one_per_row():
    assert label_as_output(np.arange(4.0), (1,)).shape == (4, 1)
    np.testing.assert_array_equal(label_as_output(np.arange(12).reshape(2, 6), (2, 3)), np.arange(12).reshape(2, 2, 3))
    assert label_as_output(np.arange(4.0).reshape(4, 1), (3,)).shape == (4,)


def _spec(store, run_id="r"):
    return DataSpec(store=store, run_id=run_id, train_path="t", val_path=None, columns=["x"], feature_cols=["x"],
                    label_cols=["y"], sample_weight_col=None, batch_size=2, val_batch_size=2, epochs=1, steps=1,
                    val_steps=1, shuffle_buffer_size=0, seed=None, verbose=0, transformation_fn=None,
                    inmemory_cache_all=False)


def test_a_run_saves_its_checkpoint_and_history_and_a_store_without_runs_keeps_none(tmp_path):
    spec = _spec(Store.create(str(tmp_path / "s")))
    assert spec.saved_checkpoint() is None
    spec.save(b"state", [{"epoch": 0, "train": {"loss": 1.5}}])
    assert spec.saved_checkpoint() == b"state" and spec.saved_history() == [{"epoch": 0, "train": {"loss": 1.5}}]
    assert _spec(spec.store, "other").saved_checkpoint() is None
    without_runs = _spec(Store.create(str(tmp_path / "n"), save_runs=False))
    without_runs.save(b"state", {})
    assert without_runs.saved_checkpoint() is None and not (tmp_path / "n").exists()


def test_a_numeric_learning_rate_is_scaled_and_a_schedule_left_as_given():
    pytest.importorskip("keras")
    import keras

    from hvdlite.spark.keras.remote import scales_learning_rate

    assert scales_learning_rate(keras.optimizers.serialize(keras.optimizers.SGD(0.1)))
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.9)
    assert not scales_learning_rate(keras.optimizers.serialize(keras.optimizers.SGD(schedule)))


def test_ranks_train_on_gpus_only_when_asked_and_every_rank_has_its_own():
    from hvdlite.spark.common.device import DeviceError, RankDevice, uses_gpu

    two_gpus_each = [RankDevice(0, 2), RankDevice(1, 2), RankDevice(0, 2)]
    assert uses_gpu(True, two_gpus_each)
    assert not uses_gpu(False, two_gpus_each)  # use_gpu=False: the CPU even where there are GPUs
    assert not uses_gpu(True, [RankDevice(0, 0), RankDevice(1, 0)])  # no GPUs anywhere: the CPU
    with pytest.raises(DeviceError, match=r"ranks \[0, 2\] have GPUs but ranks \[1\] have none"):
        uses_gpu(True, [RankDevice(0, 1), RankDevice(0, 0), RankDevice(1, 2)])
    with pytest.raises(DeviceError, match=r"rank 2 \(local rank 2, 2 GPUs\) would share a GPU"):
        uses_gpu(True, [RankDevice(0, 2), RankDevice(1, 2), RankDevice(2, 2)])
    assert not uses_gpu(False, [RankDevice(0, 1), RankDevice(0, 0)])  # nothing to agree on without GPUs


def test_the_lightning_estimators_parameters_reach_each_ranks_trainer():
    pytest.importorskip("lightning")
    from hvdlite.spark.lightning.estimator import TorchEstimator, _trainer_args

    params = {"log_every_n_steps": 5, "logger": None, "profiler": "simple", "terminate_on_nan": True,
              "trainer_args": {"log_every_n_steps": 7, "gradient_clip_val": 1.0}}
    assert _trainer_args(params) == {"log_every_n_steps": 7, "profiler": "simple", "detect_anomaly": True,
                                     "gradient_clip_val": 1.0}
    estimator = TorchEstimator(num_gpus=0, trainer_args={"max_steps": 3})
    assert estimator.getNumGpus() == 0 and estimator.getTrainerArgs() == {"max_steps": 3}
    with pytest.raises(ParamsError, match=r"TorchEstimator\(data_module=...\) is not supported"):
        TorchEstimator(data_module=object())
