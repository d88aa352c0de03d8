"""TorchState.sync's rule for leaving replicated models and optimizers as they are, in process.

Only the structural half is here (no collective runs when it says no: hvdlite is not started in
these tests); the counting half runs in tests/multirank/test_elastic*.py, where ranks die."""

import types

import pytest

torch = pytest.importorskip("torch")
from hvdlite.torch.elastic import TorchState  # noqa: E402


def _state(optimizer_reducer=None, cover_all=True):
    model = torch.nn.Linear(2, 1)
    params = list(model.parameters()) if cover_all else list(model.parameters())[:1]
    optimizer = torch.optim.SGD(params, lr=0.1)
    if optimizer_reducer is not None:
        optimizer._hvdlite_reducer = optimizer_reducer
    return TorchState(model, optimizer)


def test_a_plain_optimizer_keeps_the_broadcast():
    assert _state()._replicas_alike() == []


def test_local_sgd_keeps_the_broadcast_its_replicas_differ_between_averages():
    assert _state(types.SimpleNamespace(local_sgd=object()))._replicas_alike() == []


def test_a_model_parameter_no_averaging_optimizer_steps_keeps_the_broadcast():
    assert _state(types.SimpleNamespace(local_sgd=None), cover_all=False)._replicas_alike() == []


def test_averaging_over_a_process_set_keeps_the_broadcast_the_sets_replicas_differ_from_the_others():
    from hvdlite.process_sets import ProcessSet

    reducer = types.SimpleNamespace(local_sgd=None, process_set=ProcessSet([0, 1]))
    assert _state(reducer)._replicas_alike() == []
