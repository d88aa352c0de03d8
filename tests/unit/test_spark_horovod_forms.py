"""Horovod's forms the Spark jobs and estimators take: input shapes, label shapes, output tags,
and the parameters hvdlite ignores or refuses (pure logic; the fits are in tests/multirank)."""

import logging

import numpy as np
import pytest
from hvdlite.runner.remote.job import horovod_tagged

from hvdlite.spark.common.horovod_params import IGNORED, REFUSED, refusals, warn_if_ignored
from hvdlite.spark.common.params import ParamsError
from hvdlite.spark.common.prepare import Prepared
from hvdlite.spark.common.shapes import batched, keras_input_shapes, reshaped
from hvdlite.spark.estimator import check_label_shapes


def test_input_shapes_of_one_row_get_a_batch_dimension():
    assert batched([[2], [-1, 2], [1, 28, 28], [-1, 1, 28, 28]]) == [[-1, 2], [-1, 2], [-1, 1, 28, 28], [-1, 1, 28, 28]]
    assert batched(None) is None
    values = reshaped([np.zeros((4, 2))], batched([[2]]))
    assert values[0].shape == (4, 2)


class _Input:
    def __init__(self, *dims):
        self.shape = (None, *dims)


class _Model:
    def __init__(self, *inputs):
        self.inputs = list(inputs)


def test_keras_columns_take_the_shape_of_the_models_inputs_where_they_hold_as_many_values():
    assert keras_input_shapes(_Model(_Input(8, 8, 1)), [(64,)]) == [[-1, 8, 8, 1]]
    assert keras_input_shapes(_Model(_Input(2)), [(2,)]) is None  # already the shape
    assert keras_input_shapes(_Model(_Input(8, 8, 1), _Input(3)), [(64,), (3,)]) == [[-1, 8, 8, 1], [-1, 3]]
    assert keras_input_shapes(_Model(_Input(5)), [(64,)]) is None  # the model check names the mismatch
    assert keras_input_shapes(_Model(_Input(None, 4)), [(8,)]) is None  # an unknown dimension: as it is
    assert keras_input_shapes(object(), [(2,)]) is None  # no inputs known


def _prepared(**shapes):
    return Prepared("train", None, 10, 0, shapes)


def test_label_shapes_are_accepted_where_they_are_the_shapes_hvdlite_gives_the_labels():
    check_label_shapes(None, [(1,)], _prepared(y=()), ["y"])
    check_label_shapes([[1]], [(1,)], _prepared(y=()), ["y"])
    check_label_shapes([[-1, 3]], [(3,)], _prepared(y=(3,)), ["y"])
    check_label_shapes([[-1]], [(10,)], _prepared(y=()), ["y"])  # a class index per row
    with pytest.raises(ParamsError, match=r"label column 'y' the per-row shape \(3, 1\).*\(3,\)"):
        check_label_shapes([[3, 1]], [(3,)], _prepared(y=(3,)), ["y"])
    with pytest.raises(ParamsError, match="label_shapes has 2 shapes for 1 label columns"):
        check_label_shapes([[1], [1]], [(1,)], _prepared(y=()), ["y"])


def test_rank_lines_are_tagged_as_horovods():
    assert horovod_tagged(b"[1]: loss 0.5\n", b"stdout") == b"[1]<stdout>:loss 0.5\n"
    assert horovod_tagged(b"[0]: [1]: x\n", b"stderr") == b"[0]<stderr>:[1]: x\n"
    assert horovod_tagged(b"hvdliterun: done\n", b"stderr") == b"hvdliterun: done\n"
    stamped = horovod_tagged(b"[0]: hi\n", b"stdout", timestamp=True)
    assert stamped.endswith(b"[0]<stdout>:hi\n") and len(stamped) > len(b"[0]<stdout>:hi\n")


def test_horovods_parameters_are_ignored_with_a_warning_or_refused_with_the_reason(caplog):
    assert set(IGNORED).isdisjoint(REFUSED)
    with caplog.at_level(logging.WARNING, logger="hvdlite.spark"):
        warn_if_ignored("reader_pool_type", "thread", "TorchEstimator")
        warn_if_ignored("reader_pool_type", None, "TorchEstimator")
        warn_if_ignored("batch_size", 8, "TorchEstimator")
    assert [record.getMessage() for record in caplog.records] == [
        f"TorchEstimator: reader_pool_type is ignored: {IGNORED['reader_pool_type']}"]
    assert refusals({"data_module": object, "checkpoint_callback": None}, "KerasEstimator") == [
        f"KerasEstimator(data_module=...) is not supported: {REFUSED['data_module']}"]
