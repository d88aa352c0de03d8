"""torch DistributedOptimizer checks its arguments before anything needs hvd.init(), as Horovod does."""

import pytest
import torch

import hvdlite.torch as hvd


def _optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_duplicate_parameter_names_are_a_value_error_before_init():
    assert not hvd.is_initialized()
    model, optimizer = _optimizer()
    named = [("same", p) for p in model.parameters()]
    with pytest.raises(ValueError, match=r"must be unique. Found duplicates: \['same'\]"):
        hvd.DistributedOptimizer(optimizer, named_parameters=named)


@pytest.mark.parametrize("arguments, error", [({"backward_passes_per_step": 0}, ValueError),
                                              ({"named_parameters": [("a", 1)]}, ValueError)])
def test_other_argument_errors_come_before_init_too(arguments, error):
    _, optimizer = _optimizer()
    with pytest.raises(error):
        hvd.DistributedOptimizer(optimizer, **arguments)
    with pytest.raises(TypeError, match="wraps a torch.optim.Optimizer"):
        hvd.DistributedOptimizer(object())


def test_valid_arguments_still_need_init():
    _, optimizer = _optimizer()
    with pytest.raises(hvd.NotInitializedError):
        hvd.DistributedOptimizer(optimizer)
    with pytest.raises(ValueError, match="init"):  # Horovod's type for it
        hvd.rank()
