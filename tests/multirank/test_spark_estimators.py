"""Horovod's Spark estimators on hvdlite, on the shared local Spark cluster (tests/multirank/conftest.py):
fit on a DataFrame of a known function, predict with ``transform``, save and load, resume a run,
and the clear errors for bad input. The fits are examples/spark_torch_estimator.py's."""

import functools
import sys

import cloudpickle
import numpy as np
import pytest

from hvdlite.spark.common.params import ParamsError

from . import remote_training

pytestmark = pytest.mark.multirank
torch = pytest.importorskip("torch")


example = remote_training.example("spark_torch_estimator")
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _horovod_style_step(marker, model, optimizer, transform_outputs, loss_fn, inputs, labels, sample_weights):
    """A train_minibatch_fn as Horovod's documentation writes one, leaving a mark that it ran."""
    optimizer.zero_grad()
    outputs, labels = transform_outputs(model(*inputs), labels)
    loss = loss_fn(outputs, labels, sample_weights)
    loss.backward()
    optimizer.step()
    with open(marker, "a") as file:
        file.write(f"{len(inputs[0])}\n")
    return outputs, loss


def test_torch_estimator_in_a_pipeline_learns_predicts_saves_and_resumes(spark, tmp_path):
    from pyspark.ml import PipelineModel
    from pyspark.ml.feature import VectorAssembler

    from hvdlite.spark.torch import TorchModel

    store = str(tmp_path / "store")
    fitted, predicted = example.fit_and_predict(spark, store)
    model = fitted.stages[-1]
    history = model.getHistory()  # Horovod's: one entry per epoch
    losses, val_losses = [e["train"]["loss"] for e in history], [e["validation"]["loss"] for e in history]
    assert [e["epoch"] for e in history] == [0, 1, 2], history
    assert losses[-1] < 0.01 * losses[0] and val_losses[-1] < 1e-3, history
    np.testing.assert_allclose(model.getModel().weight.detach().numpy()[0], example.WEIGHTS, atol=0.05)

    predicted = predicted.select("x1", "x2", "features", "y__output").toPandas()
    by_hand = model.getModel()(torch.tensor(predicted[["x1", "x2"]].to_numpy(), dtype=torch.float32))
    np.testing.assert_allclose(predicted["y__output"], by_hand.detach().numpy()[:, 0], rtol=1e-5, atol=1e-6)

    model.write().save(str(tmp_path / "saved"))
    loaded = TorchModel.load(str(tmp_path / "saved"))
    assert loaded.getHistory() == history and loaded.getLabelColumns() == ["y"]
    again = loaded.transform(fitted.stages[0].transform(spark.createDataFrame(example.linear_rows(320),
                                                                              ["x1", "x2", "y", "is_val"])))
    np.testing.assert_allclose(again.select("y__output").toPandas()["y__output"], predicted["y__output"], rtol=1e-6)
    fitted.write().save(str(tmp_path / "pipeline"))  # Spark's own PipelineModel writer and reader, as Horovod's
    reloaded = PipelineModel.load(str(tmp_path / "pipeline"))
    assert [type(stage) for stage in reloaded.stages] == [VectorAssembler, TorchModel]
    assert reloaded.stages[-1].uid == model.uid and reloaded.stages[-1].getHistory() == history
    rows = reloaded.transform(spark.createDataFrame(example.linear_rows(320), ["x1", "x2", "y", "is_val"]))
    np.testing.assert_allclose(rows.select("y__output").toPandas()["y__output"], predicted["y__output"], rtol=1e-6)

    marker = tmp_path / "steps"
    step = functools.partial(_horovod_style_step, str(marker))
    # use_gpu=False, as Horovod scripts for CPU clusters say it: the CPU, as without GPUs (tests/unit has the rules)
    resumed = example.fit_and_predict(spark, store, epochs=2, train_minibatch_fn=step, use_gpu=False)[0].stages[-1]
    assert marker.read_text().split() == ["8"] * (2 * 2 * 16)  # 2 epochs, 2 ranks, 16 steps of 8 rows
    assert resumed.getHistory()[:3] == history  # the first three epochs were not run again
    assert len(resumed.getHistory()) == 5 and resumed.getHistory()[-1]["train"]["loss"] <= losses[-1]


def test_bad_input_is_named_before_any_rank_starts(spark, tmp_path):
    from hvdlite.spark.common.store import StoreError

    frame = spark.createDataFrame(example.linear_rows(40), ["x1", "x2", "y", "is_val"])
    store = str(tmp_path / "store")
    with pytest.raises(ParamsError, match=r"column\(s\) \['weight'\] not found in the training DataFrame"):
        example.pipeline(store, "a", sample_weight_col="weight").fit(frame)
    with pytest.raises(ParamsError, match=r"label column 'features' has shape \(2,\) per row but the model's output"):
        example.pipeline(store, "b", label_cols=["features"]).fit(frame)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StoreError, match="cannot write"):
        example.pipeline(str(blocker / "store"), "c").fit(frame)
    with pytest.raises(Exception, match="num_proc=3 ranks need 3 task slots"):
        example.pipeline(store, "d", num_proc=3).fit(frame)
    with pytest.raises(ParamsError, match="TorchEstimator has no parameter 'backnd'"):
        example.pipeline(store, "e", backnd="spark")
    with pytest.raises(ParamsError, match=r"backend must be a Backend .* got 'spark'"):
        example.pipeline(store, "f", backend="spark").fit(frame)
    with pytest.raises(ParamsError, match=r"TorchEstimator\(data_module=...\) is not supported: hvdlite reads"):
        example.pipeline(store, "g", data_module=object)
    with pytest.raises(ParamsError, match=r"label_shapes gives label column 'y' the per-row shape \(2,\)"):
        example.pipeline(store, "h", label_shapes=[[2]]).fit(frame)
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []


def test_keras_estimator_with_indexed_strings_vectors_and_arrays_learns_predicts_saves_and_resumes(spark, tmp_path):
    pytest.importorskip("keras")
    keras_example = remote_training.example("spark_keras_estimator")
    from hvdlite.spark.keras import KerasModel

    store = str(tmp_path / "store")
    fitted, predicted = keras_example.fit_and_predict(spark, store)
    model = fitted.stages[-1]
    history = model.getHistory()  # Keras's: one value per epoch for each metric
    assert sorted(history) == ["accuracy", "loss", "val_accuracy", "val_loss"], history
    assert float(model.getModel().optimizer.learning_rate) == pytest.approx(0.02)  # compiled, as given
    assert len(history["loss"]) == 4 and history["loss"][-1] < 0.3 * history["loss"][0], history
    assert history["val_accuracy"][-1] > 0.9, history

    rows = predicted.select("features", "extra", "label", "label__output").toPandas()
    inputs = [np.stack(rows["features"].map(lambda v: v.toArray())), np.stack(rows["extra"])]
    by_hand = model.getModel().predict_on_batch([value.astype(np.float32) for value in inputs])
    outputs = np.stack(rows["label__output"])
    np.testing.assert_allclose(outputs, by_hand, rtol=1e-4, atol=1e-5)
    assert (outputs.argmax(axis=1) == rows["label"]).mean() > 0.9

    model.write().save(str(tmp_path / "saved"))
    loaded = KerasModel.load(str(tmp_path / "saved"))
    assert loaded.getHistory() == history and loaded.getOutputShapes() == [[3]]
    again = loaded.transform(fitted.stages[1].transform(fitted.stages[0].transform(
        spark.createDataFrame(keras_example.colour_rows(640), keras_example.COLUMNS)))).toPandas()
    np.testing.assert_allclose(np.stack(again["label__output"]), outputs, rtol=1e-5)

    resumed = keras_example.fit_and_predict(spark, store, epochs=2, use_gpu=False)[0].stages[-1].getHistory()
    assert {name: values[:4] for name, values in resumed.items()} == history  # not run again
    # Epoch 5 starts from the saved weights and optimizer: far below where a new model starts.
    assert len(resumed["loss"]) == 6 and resumed["loss"][4] < 0.5 * history["loss"][0], resumed

    frame = spark.createDataFrame(keras_example.colour_rows(40), keras_example.COLUMNS)
    with pytest.raises(ParamsError, match=r"label column 'extra' has shape \(2,\) per row but the model's output for it has \(3,\)"):
        keras_example.pipeline(store, "bad", label_cols=["extra"]).fit(frame)
    with pytest.raises(ParamsError, match=r"the model cannot take the feature columns \['features'\]"):
        keras_example.pipeline(store, "bad", feature_cols=["features"]).fit(frame)


def test_a_torch_model_built_by_hand_types_its_predictions_as_horovods(spark):
    """One value per row takes the label's type (rounded for an integer label), a vector output is a
    DenseVector, and a vector label gets a vector even of one value; shapes and columns found by transform."""
    from pyspark.ml.linalg import DenseVector, VectorUDT
    from pyspark.sql.types import DoubleType, FloatType, IntegerType, StructField, StructType

    from hvdlite.spark.torch import TorchModel

    schema = StructType([StructField("x", VectorUDT()), StructField("count", IntegerType()),
                         StructField("score", FloatType()), StructField("vec", VectorUDT())])
    frame = spark.createDataFrame([(DenseVector([1.0, 1.3]), 0, 0.0, DenseVector([0.0])),
                                   (DenseVector([-2.0, 0.4]), 0, 0.0, DenseVector([0.0]))], schema)

    class Outputs(torch.nn.Module):
        def forward(self, x):
            total = x.sum(dim=1, keepdim=True)
            return total, 0.5 * total, torch.cat([x, total], dim=1), total

    model = TorchModel(model=Outputs(), feature_columns=["x"], label_columns=["count", "score", "none", "vec"])
    out = model.transform(frame).drop("x")
    assert out.columns[-4:] == ["count__output", "score__output", "none__output", "vec__output"], out.columns
    types = {field.name: type(field.dataType) for field in out.schema.fields}
    assert [types[n] for n in out.columns[-4:]] == [IntegerType, FloatType, VectorUDT, VectorUDT], types
    rows = out.collect()
    assert [row["count__output"] for row in rows] == [2, -2]  # 2.3 and -1.6, rounded
    assert [row["score__output"] for row in rows] == pytest.approx([1.15, -0.8])
    assert rows[0]["none__output"].toArray().tolist() == pytest.approx([1.0, 1.3, 2.3])
    assert rows[1]["vec__output"].toArray().tolist() == pytest.approx([-1.6])
    no_label = TorchModel(model=torch.nn.Linear(2, 1), feature_columns=["x"], output_cols=["p"])
    assert type(no_label.transform(frame).schema["p"].dataType) is DoubleType


def test_a_keras_model_with_an_unregistered_custom_layer_predicts_on_the_executors_and_loads_back(spark, tmp_path):
    keras = pytest.importorskip("keras")
    from hvdlite.spark.keras import KerasModel

    class Doubler(keras.layers.Layer):  # local, not registered: Keras finds it only through custom_objects
        def call(self, inputs):
            return 2.0 * inputs

    inputs = keras.Input((2,))
    model = keras.Model(inputs, Doubler()(keras.layers.Dense(1, kernel_initializer="ones")(inputs)))
    fitted = KerasModel(model=model, custom_objects={"Doubler": Doubler}, feature_columns=["x"], label_columns=["y"],
                        output_cols=["y__output"], label_shapes=[[1]], output_shapes=[[1]], history={}, run_id="r")
    frame = spark.createDataFrame([([1.0, 2.0], 0.0), ([3.0, -4.0], 0.0)], ["x", "y"])
    assert fitted.transform(frame).toPandas()["y__output"].tolist() == [6.0, -2.0]  # 2 * (x1 + x2)
    fitted.write().save(str(tmp_path / "saved"))
    loaded = KerasModel.load(str(tmp_path / "saved"))
    assert loaded.transform(frame).toPandas()["y__output"].tolist() == [6.0, -2.0]


def test_an_unfitted_pipeline_with_either_estimator_saves_and_loads_with_sparks_writer(spark, tmp_path):
    from pyspark.ml import Pipeline

    from hvdlite.spark.torch import TorchEstimator

    pipeline = example.pipeline(str(tmp_path / "store"), "saved", batch_size=4)
    pipeline.write().save(str(tmp_path / "torch"))
    estimator = Pipeline.load(str(tmp_path / "torch")).getStages()[-1]
    original = pipeline.getStages()[-1]
    assert type(estimator) is TorchEstimator and estimator.uid == original.uid
    assert (estimator.getBatchSize(), estimator.getRunId(), estimator.getLabelCols()) == (4, "saved", ["y"])
    assert estimator.getStore().get_train_data_path() == original.getStore().get_train_data_path()
    assert torch.equal(estimator.getModel().weight, original.getModel().weight)
    # pickled together: the optimizer still steps the loaded model's own parameters
    assert estimator.getOptimizer().param_groups[0]["params"][0] is estimator.getModel().weight

    keras = pytest.importorskip("keras")
    from hvdlite.spark.keras import KerasEstimator

    keras_example = remote_training.example("spark_keras_estimator")
    pipeline = keras_example.pipeline(str(tmp_path / "store"), "saved")
    pipeline.write().save(str(tmp_path / "keras"))
    estimator, original = Pipeline.load(str(tmp_path / "keras")).getStages()[-1], pipeline.getStages()[-1]
    assert type(estimator) is KerasEstimator and estimator.getEpochs() == original.getEpochs()
    for loaded, given in zip(estimator.getModel().get_weights(), original.getModel().get_weights(), strict=True):
        np.testing.assert_array_equal(loaded, given)
    assert isinstance(estimator.getModel(), keras.Model)


def _linear_module():
    """A LightningModule as Horovod's Lightning estimator takes one: batches are dicts of columns."""
    import lightning as L  # noqa: N812

    class Linear(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 1)

        def forward(self, features):
            return self.linear(features.float())

        def _loss(self, batch):
            return torch.nn.functional.mse_loss(self(batch["features"]), batch["y"].float().unsqueeze(1))

        def training_step(self, batch, _):
            loss = self._loss(batch)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, _):
            self.log("val_loss", self._loss(batch))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.3)

    torch.manual_seed(0)
    return Linear()


def _lightning_fit_inputs(spark, tmp_path):
    """A DataFrame of the linear example with a feature vector, and the Lightning estimator's options."""
    from pyspark.ml.feature import VectorAssembler

    from hvdlite.spark import Store

    frame = VectorAssembler(inputCols=["x1", "x2"], outputCol="features").transform(
        spark.createDataFrame(example.linear_rows(320), ["x1", "x2", "y", "is_val"]))
    options = dict(num_proc=2, store=Store.create(str(tmp_path / "store")), model=_linear_module(),
                   feature_cols=["features"], label_cols=["y"], validation="is_val", batch_size=8,
                   random_seed=1, run_id="lightning", verbose=0, partitions_per_process=2,
                   input_shapes=[[-1, 2]], trainer_args={"enable_model_summary": False})
    return frame, options


def test_lightning_estimator_fits_a_lightning_module_predicts_and_resumes(spark, tmp_path):
    from hvdlite.spark.lightning import TorchEstimator, TorchModel

    frame, options = _lightning_fit_inputs(spark, tmp_path)
    fitted = TorchEstimator(epochs=3, **options).fit(frame)
    assert isinstance(fitted, TorchModel)
    history = fitted.getHistory()  # one entry per epoch, the logged values averaged over the ranks
    assert [entry["epoch"] for entry in history] == [0, 1, 2], history
    assert history[-1]["train_loss"] < 0.05 * history[0]["train_loss"] and history[-1]["val_loss"] < 1e-2, history
    np.testing.assert_allclose(fitted.getModel().linear.weight.detach().numpy()[0], example.WEIGHTS, atol=0.1)

    predicted = fitted.transform(frame).select("x1", "x2", "y__output").toPandas()
    by_hand = fitted.getModel()(torch.tensor(predicted[["x1", "x2"]].to_numpy(), dtype=torch.float32))
    np.testing.assert_allclose(predicted["y__output"], by_hand.detach().numpy()[:, 0], rtol=1e-5, atol=1e-6)

    resumed = TorchEstimator(epochs=2, **options).fit(frame)  # the run's checkpoint, then two epochs more
    assert resumed.getHistory()[:3] == history and len(resumed.getHistory()) == 5, resumed.getHistory()
    with pytest.raises(ParamsError, match="optimizer cannot be given with a LightningModule"):
        TorchEstimator(epochs=1, optimizer=torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1),
                       **options).fit(frame)


def test_lightning_estimator_fits_horovods_legacy_form_as_the_torch_estimator(spark, tmp_path):
    # A plain module with an optimizer and a loss (Horovod's "legacy" form)
    from hvdlite.spark.lightning import TorchEstimator
    from hvdlite.spark.torch import TorchModel as PlainTorchModel

    frame, options = _lightning_fit_inputs(spark, tmp_path)
    plain = torch.nn.Linear(2, 1)
    legacy = TorchEstimator(epochs=1, **{**options, "model": plain, "run_id": "legacy", "trainer_args": None},
                            optimizer=torch.optim.SGD(plain.parameters(), lr=0.1),
                            loss=torch.nn.functional.mse_loss).fit(frame)
    assert type(legacy) is PlainTorchModel
    assert [entry["epoch"] for entry in legacy.getHistory()] == [0] and "train" in legacy.getHistory()[0]
