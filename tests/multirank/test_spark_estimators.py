"""Horovod's Spark estimators on hvdlite, on the shared local Spark cluster (tests/multirank/conftest.py):
fit on a DataFrame of a known function, predict with ``transform``, save and load, resume a run,
and the clear errors for bad input. The fits are examples/spark_torch_estimator.py's."""

import importlib.util
import sys
from pathlib import Path

import cloudpickle
import numpy as np
import pytest

pytestmark = pytest.mark.multirank
torch = pytest.importorskip("torch")
_spec = importlib.util.spec_from_file_location(
    "spark_torch_estimator", Path(__file__).resolve().parents[2] / "examples" / "spark_torch_estimator.py")
example = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks need not import this module
cloudpickle.register_pickle_by_value(example)


def test_torch_estimator_in_a_pipeline_learns_predicts_saves_and_resumes(spark, tmp_path):
    from hvdlite.spark.torch import TorchModel

    store = str(tmp_path / "store")
    fitted, predicted = example.fit_and_predict(spark, store)
    model = fitted.stages[-1]
    history = model.getHistory()
    assert len(history["loss"]) == 3 and len(history["val_loss"]) == 3
    assert history["loss"][-1] < 0.01 * history["loss"][0] and history["val_loss"][-1] < 1e-3, history
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

    resumed = example.fit_and_predict(spark, store, epochs=5)[0].stages[-1]
    assert resumed.getHistory()["loss"][:3] == history["loss"]  # the first three epochs were not run again
    assert len(resumed.getHistory()["loss"]) == 5 and resumed.getHistory()["loss"][-1] <= history["loss"][-1]


def test_bad_input_is_named_before_any_rank_starts(spark, tmp_path):
    from hvdlite.spark.common.params import ParamsError
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
    with pytest.raises(ParamsError, match="TorchEstimator has no parameter 'backend'"):
        example.pipeline(store, "e", backend="spark")
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []
