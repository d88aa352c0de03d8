"""In-process checks of the torch adapter's pure parts: conversion, compression, parameter naming."""

import numpy as np
import pytest
import torch

from hvdlite.errors import UnsupportedOperationError
from hvdlite.torch.collectives.tensors import from_numpy, is_aliased, to_numpy
from hvdlite.torch.compression import Compression
from hvdlite.torch.gradients.grad_sync import _split_groups, name_parameters
from hvdlite.torch.gradients.sparse import empty_gradient
from hvdlite.utils import dtypes


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                                   torch.bfloat16, torch.float32, torch.float64, torch.bool])
def test_conversion_shares_memory_both_ways(dtype):
    tensor = torch.arange(6).reshape(2, 3).to(dtype)
    array = to_numpy(tensor)
    assert is_aliased(tensor) and array.ctypes.data == tensor.data_ptr() and array.shape == (2, 3)
    back = from_numpy(array)
    assert back.dtype == dtype and back.data_ptr() == tensor.data_ptr() and torch.equal(back, tensor)


def test_bfloat16_values_survive_the_int16_view():
    tensor = torch.tensor([1.5, -2.25, 3e38], dtype=torch.bfloat16)
    array = to_numpy(tensor)
    assert array.dtype == dtypes.bfloat16
    assert array.astype(np.float32).tolist() == tensor.float().tolist()


def test_non_contiguous_tensor_is_copied_not_aliased():
    tensor = torch.arange(6.0).reshape(2, 3).t()
    array = to_numpy(tensor)
    assert array.flags.c_contiguous and not is_aliased(tensor) and array.ctypes.data != tensor.data_ptr()
    assert array.tolist() == tensor.tolist()


def test_unsupported_dtype_and_sparse_name_the_tensor():
    with pytest.raises(UnsupportedOperationError, match="'grad.w' has dtype torch.complex64"):
        to_numpy(torch.ones(2, dtype=torch.complex64), "grad.w")
    with pytest.raises(UnsupportedOperationError, match="sparse"):
        to_numpy(torch.eye(2).to_sparse(), "grad.e")


@pytest.mark.parametrize("name,wire", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_compression_casts_floats_only_and_restores_dtype(name, wire):
    compressor = getattr(Compression, name)
    sent, ctx = compressor.compress(torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert sent.dtype == wire
    assert compressor.decompress(sent, ctx).dtype == torch.float64
    integers = torch.tensor([1, 2])
    sent, ctx = compressor.compress(integers)
    assert sent is integers and compressor.decompress(sent, ctx) is integers
    assert Compression.none.compress(integers) == (integers, None)


def _model_and_optimizer():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    model[1].bias.requires_grad_(False)
    return model, torch.optim.SGD(model.parameters(), lr=1.0)


def test_parameter_names_follow_the_optimizer_and_skip_frozen():
    model, opt = _model_and_optimizer()
    names = name_parameters(opt, model.named_parameters())
    assert list(names.values()) == ["grad.0.weight", "grad.0.bias", "grad.1.weight"]
    assert list(name_parameters(opt, None).values()) == ["grad.noname.0", "grad.noname.1", "grad.noname.2"]


def test_parameter_name_errors_say_what_is_wrong():
    model, opt = _model_and_optimizer()
    params = list(model.named_parameters())
    with pytest.raises(ValueError, match=r"duplicates: \['w'\]"):
        name_parameters(opt, [("w", params[0][1]), ("w", params[1][1])])
    with pytest.raises(ValueError, match=r"were not named: param_groups\[0\]\['params'\]\[2\] of shape \(1, 3\)"):
        name_parameters(opt, params[:2] + params[3:])
    with pytest.raises(ValueError, match="sequence of tuples"):
        name_parameters(opt, [p for _, p in params])


def test_groups_split_evenly_or_as_given():
    params = [torch.nn.Parameter(torch.ones(1)) for _ in range(5)]
    assert [len(g) for g in _split_groups(params, 2)] == [2, 3]
    assert _split_groups(params, None) == [] and _split_groups(params, 0) == []
    assert [len(g) for g in _split_groups(params, 9)] == [1] * 5
    assert _split_groups(params, [[params[0], params[3]]]) == [[params[0], params[3]]]
    with pytest.raises(ValueError, match=r"groups\[0\]"):
        _split_groups(params, [[torch.nn.Parameter(torch.ones(1))]])


def test_a_missing_sparse_gradient_is_a_sparse_zero_with_no_entries():
    """What a rank that skipped an embedding contributes: rows shaped like the other ranks' rows."""
    embedding = torch.nn.Embedding(5, 3, sparse=True).double()
    embedding(torch.tensor([1, 4])).sum().backward()
    real = embedding.weight.grad.coalesce()
    grad = empty_gradient(embedding.weight, real.sparse_dim())
    assert grad.is_sparse and grad.shape == real.shape and grad.dtype == real.dtype and grad._nnz() == 0
    assert grad._indices().shape == (1, 0) and grad._values().shape == (0, 3)
    assert torch.equal(grad.to_dense(), torch.zeros(5, 3, dtype=torch.float64))
    assert torch.equal((grad + real).to_dense(), real.to_dense())


def test_in_place_forms_copy_back_only_when_the_device_array_is_not_the_tensor_itself(monkeypatch):
    # A CPU tensor stands in for a CUDA one: _device_array only reads its pointer, shape and device.
    from hvdlite.gpu import arrays as gpu_arrays
    from hvdlite.torch.collectives import async_ops, tensors

    monkeypatch.setattr(tensors, "current_stream", lambda device: 0x80)
    monkeypatch.setattr(gpu_arrays, "record_ready", lambda stream, device: None)
    tensor = torch.arange(6.0).reshape(2, 3)
    array = tensors._device_array(tensor, np.dtype(np.float32))
    assert array.owner is tensor and array.ptr == tensor.data_ptr() and array.shape == (2, 3)
    assert async_ops._copy_back(tensor, array)(None) is tensor

    transposed = torch.arange(6.0).reshape(2, 3).t()
    copy = tensors._device_array(transposed, np.dtype(np.float32))
    assert copy.owner is not transposed and copy.ptr != transposed.data_ptr()
    result = np.full((3, 2), 7.0, np.float32)  # the reduced values, contiguous
    assert async_ops._copy_back(transposed, copy)(result) is transposed
    assert transposed.eq(7.0).all()
