"""Where broadcast_optimizer_state's receiving ranks allocate the root's state tensors."""

from types import SimpleNamespace

import torch

from hvdlite.torch.collectives.state import receiving_device


def _optimizer(*devices: torch.device) -> SimpleNamespace:
    return SimpleNamespace(param_groups=[{"params": [SimpleNamespace(device=d) for d in devices]}])


def test_state_the_root_holds_on_a_gpu_goes_beside_this_ranks_own_gpu_parameters() -> None:
    optimizer = _optimizer(torch.device("cpu"), torch.device("cuda", 3))
    assert receiving_device("cuda", optimizer) == torch.device("cuda", 3)


def test_cpu_state_stays_on_the_cpu_even_beside_gpu_parameters() -> None:
    # Adam's "step" is a CPU scalar next to CUDA parameters.
    assert receiving_device("cpu", _optimizer(torch.device("cuda", 0))) == torch.device("cpu")


def test_without_a_parameter_on_that_kind_of_device_the_current_one_is_used() -> None:
    assert receiving_device("cuda", _optimizer(torch.device("cpu"))) == torch.device("cuda")
