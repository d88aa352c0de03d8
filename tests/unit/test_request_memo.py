"""The allreduce description memo (hvdlite.core.describe): reused only for identical calls, errors never cached."""

import numpy as np
import pytest

from hvdlite.core.describe import Descriptions
from hvdlite.errors import UnsupportedOperationError
from hvdlite.ops import Collective, ReduceOp

_memo = Descriptions()  # the runtime holds one; these tests need no init()


def _meta(array, name="t", op=ReduceOp.SUM, prescale=1.0, postscale=1.0):
    return _memo.reduction(Collective.ALLREDUCE, array, name, op, prescale, postscale)


def test_the_same_call_reuses_its_description_and_any_difference_makes_a_new_one():
    first = _meta(np.zeros(3, np.float32))
    assert _meta(np.ones(3, np.float32)) is first
    others = [_meta(np.zeros(4, np.float32)), _meta(np.zeros(3, np.float64)), _meta(np.zeros((3, 1), np.float32)),
              _meta(np.zeros(3, np.float32), name="u"), _meta(np.zeros(3, np.float32), op=ReduceOp.MAX),
              _meta(np.zeros(3, np.float32), postscale=2.0)]
    assert all(other != first for other in others)
    assert [(m.shape, m.dtype, m.name, m.op, m.postscale) for m in others[:3]] == [
        ((4,), "float32", "t", ReduceOp.SUM, 1.0), ((3,), "float64", "t", ReduceOp.SUM, 1.0),
        ((3, 1), "float32", "t", ReduceOp.SUM, 1.0)]


def test_scale_factors_may_be_numpy_or_torch_scalars():
    import torch

    meta = _meta(np.zeros(2, np.float32), prescale=np.float32(0.5), postscale=torch.tensor(2.0))
    assert (meta.prescale, meta.postscale) == (0.5, 2.0) and type(meta.prescale) is float
    assert _meta(np.zeros(2, np.float32), prescale=0.5, postscale=2.0) is meta


def test_a_rejected_call_is_rejected_every_time():
    for _ in range(2):
        with pytest.raises(UnsupportedOperationError, match="Average is not defined for bool"):
            _meta(np.zeros(2, bool), op=ReduceOp.AVERAGE)
        with pytest.raises(UnsupportedOperationError, match="non-native byte order"):
            _meta(np.zeros(2, np.dtype(">f4")))


def test_the_memo_stays_bounded():
    for index in range(Descriptions.LIMIT + 10):
        _meta(np.zeros(1, np.float32), name=f"generated.{index}")
    assert len(_memo) <= Descriptions.LIMIT
