"""The training logic written once in hvdlite.training, and the adapters that share it."""

import numpy as np
import pytest

from hvdlite import basics
from hvdlite.errors import UnsupportedOperationError
from hvdlite.ops import ReduceOp
from hvdlite.training import gradients as rules
from hvdlite.training.options import check_passes, predivide_scales, reduction_scale
from hvdlite.training.sparse import allreduce_sparse, check_sparse_op

PASSES_MESSAGE = "backward_passes_per_step must be a positive integer, got 0"


# ---- options -------------------------------------------------------------------------------------
def test_passes_are_positive_whole_numbers():
    assert check_passes(1) == 1 and check_passes(np.int64(3)) == 3
    for bad in (0, -2, 1.5, 2.0, True, "2", None):
        with pytest.raises(ValueError, match=f"backward_passes_per_step must be a positive integer, got {bad!r}"):
            check_passes(bad)


def _torch_optimizer(**options):
    import torch

    from hvdlite.torch.optimizer import DistributedOptimizer

    return DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1), **options)


def _keras_optimizer(**options):
    import keras

    from hvdlite.tensorflow.optimizer import DistributedOptimizer

    return DistributedOptimizer(keras.optimizers.SGD(), **options)


def _jax_optimizer(**options):
    import optax

    from hvdlite.jax.optimizer import DistributedOptimizer

    return DistributedOptimizer(optax.sgd(0.1), **options)


def _tape(**options):
    import tensorflow as tf

    from hvdlite.tensorflow.gradients.tape import DistributedGradientTape

    return DistributedGradientTape(tf.GradientTape(), **options)


ADAPTERS = pytest.mark.parametrize("wrap", [_torch_optimizer, _keras_optimizer, _jax_optimizer],
                                   ids=["torch", "keras", "jax"])


@ADAPTERS
def test_every_adapter_refuses_bad_passes_with_the_one_message(wrap):
    with pytest.raises(ValueError) as refused:
        wrap(backward_passes_per_step=0)
    assert str(refused.value) == PASSES_MESSAGE


@pytest.mark.parametrize("wrap", [_torch_optimizer, _keras_optimizer, _jax_optimizer, _tape],
                         ids=["torch", "keras", "jax", "tape"])
def test_every_adapter_refuses_predivide_without_average_with_the_one_message(wrap):
    with pytest.raises(ValueError) as refused:
        wrap(op=ReduceOp.SUM, gradient_predivide_factor=2.0)
    assert str(refused.value) == "gradient_predivide_factor=2.0 needs op=Average, got SUM"
    assert predivide_scales(ReduceOp.AVERAGE, 4.0) == (0.25, 4.0)


def test_reduction_scale_divides_by_the_size_for_average_only():
    assert reduction_scale(ReduceOp.AVERAGE, 0.5, 4.0, 4) == 0.5
    assert reduction_scale(ReduceOp.SUM, 0.5, 4.0, 4) == 2.0


# ---- collective gradients, with NumPy standing in for a framework at rank 1 of 3 -------------------
SIZE, RANK = 3, 1


@pytest.fixture
def rank_1_of_3(monkeypatch):
    monkeypatch.setattr(basics, "rank", lambda: RANK)
    monkeypatch.setattr(basics, "size", lambda: SIZE)


def _ops(gathered_rows=(2, 3, 1), calls=None):
    """Ops whose collectives act as if every rank held the same tensors (row counts: ``gathered_rows``)."""
    calls = [] if calls is None else calls

    def allreduce(tensors, op, prescale, postscale):
        calls.append(("allreduce", op, prescale, postscale))
        return [t * reduction_scale(op, prescale, postscale, SIZE) * SIZE for t in tensors]

    def allgather(tensors):
        calls.append(("allgather",))
        # A 1-element tensor is a row count (the allgather rule's); anything else is gathered as is.
        return [np.array(gathered_rows) if t.shape == (1,) else np.concatenate([t] * SIZE) for t in tensors]

    return rules.GradientOps(allreduce=allreduce, allgather=allgather, alltoall=lambda t, splits: (t, splits),
                             zeros_like=np.zeros_like, scale=lambda t, f: t * f, total=lambda v: int(v.sum()),
                             rows=lambda t, start, stop: t[start:stop])


def test_allreduce_gradient_is_the_same_allreduce(rank_1_of_3):
    calls = []
    grads = rules.allreduce_grads(_ops(calls=calls), (np.ones(2), np.ones(3)), ReduceOp.AVERAGE, 0.5, 2.0)
    assert calls == [("allreduce", ReduceOp.AVERAGE, 0.5, 2.0)] and [g.tolist() for g in grads] == [[1, 1], [1, 1, 1]]


def test_allgather_gradient_is_this_ranks_rows_of_the_average_as_in_horovod(rank_1_of_3):
    grad = np.arange(6.0)  # ranks gathered 2, 3 and 1 rows: rank 1's are rows 2..4
    # Horovod averages (its allgather backward is allreduce(average=True)); the sum would be 3x this
    assert rules.allgather_grad(_ops(), grad, np.array([3])).tolist() == [2.0, 3.0, 4.0]


def test_broadcast_gradient_is_the_average_on_the_root_only(rank_1_of_3):
    assert rules.broadcast_grad(_ops(), np.full(2, 4.0), root_rank=RANK).tolist() == [4.0, 4.0]
    assert rules.broadcast_grad(_ops(), np.full(2, 4.0), root_rank=0).tolist() == [0.0, 0.0]


def test_alltoall_gradient_goes_back_along_the_received_rows(rank_1_of_3):
    assert rules.alltoall_grad(_ops(), "grad", [1, 2, 0]) == ("grad", [1, 2, 0])


def test_reducescatter_gradient_gathers_and_scales_as_horovod_does(rank_1_of_3):
    # Horovod: the gathered blocks, times size for Sum (the mathematical gradient is size times smaller
    # for both ops), times the scale factors
    (averaged,) = rules.reducescatter_grads(_ops(), [np.ones(2)], ReduceOp.AVERAGE, 1.0, 1.0)
    (summed,) = rules.reducescatter_grads(_ops(), [np.ones(2)], ReduceOp.SUM, 2.0, 1.0)
    assert averaged.tolist() == [1.0] * 6 and summed.tolist() == [6.0] * 6


# ---- sparse as allgather -------------------------------------------------------------------------
@pytest.mark.parametrize("op", [ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT])
def test_sparse_ops_other_than_sum_and_average_are_refused_by_name(op):
    with pytest.raises(UnsupportedOperationError, match=f"'emb' supports Sum and Average, not {op.name}.*sparse_as_dense"):
        check_sparse_op(op, "allreduce of sparse tensor 'emb'")


def test_sparse_rows_are_gathered_then_scaled(rank_1_of_3):
    started = []

    def gather(values, indices, name):
        started.append(name)
        return lambda: (np.concatenate([values] * SIZE), np.concatenate([indices] * SIZE))

    finish = allreduce_sparse(np.ones(2), np.array([0, 4]), "emb", ReduceOp.AVERAGE, 1.0, 1.0, gather,
                              lambda t, f: t * f)
    values, indices = finish()
    assert started == ["emb"] and np.allclose(values, 1 / 3) and indices.tolist() == [0, 4] * 3


def test_torch_sparse_gradient_with_max_is_refused_naming_tensor_and_op():
    import torch

    from hvdlite.compression import NoneCompressor
    from hvdlite.torch.gradients.grad_sync import GradientSubmitter

    embedding = torch.nn.Embedding(4, 2, sparse=True)
    embedding(torch.tensor([1])).sum().backward()
    submitter = GradientSubmitter({embedding.weight: "grad.emb"}, NoneCompressor, ReduceOp.MAX, (1.0, 1.0),
                                  None, sparse_as_dense=False)
    with pytest.raises(UnsupportedOperationError, match="'grad.emb' supports Sum and Average, not MAX"):
        submitter.submit(embedding.weight)


@pytest.mark.parametrize("op", [ReduceOp.MIN, ReduceOp.MAX])
def test_tensorflow_indexed_slices_with_min_or_max_are_refused_naming_tensor_and_op(op):
    import tensorflow as tf

    import hvdlite.tensorflow as hvd

    slices = tf.IndexedSlices(tf.ones((1, 2)), tf.constant([0]), dense_shape=tf.constant([4, 2]))
    with pytest.raises(UnsupportedOperationError, match=f"'emb' supports Sum and Average, not {op.name}"):
        hvd.allreduce(slices, op=op, name="emb")
    with pytest.raises(UnsupportedOperationError, match=f"sparse tensor 1 of grouped_allreduce.*not {op.name}"):
        hvd.grouped_allreduce([tf.ones(2), slices], op=op)


def test_local_sgd_counts_are_checked_by_name():
    import torch

    from hvdlite.process_sets import global_process_set
    from hvdlite.torch.slow_links.local_sgd import LocalSGD

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    names = {p: n for n, p in model.named_parameters()}
    for period, warmup, message in ((0, 0, "local_sgd_period must be a positive integer, got 0"),
                                    (2.5, 0, "local_sgd_period must be a positive integer, got 2.5"),
                                    (2, -1, "local_sgd_warmup_steps must be an integer >= 0, got -1")):
        with pytest.raises(ValueError, match=message):
            LocalSGD(optimizer, names, period, warmup, False, global_process_set)
    local = LocalSGD(optimizer, names, 2, 1, False, global_process_set)
    assert local.synchronous
    local.steps = 1
    assert not local.synchronous
