"""torch's own tools on hvd.fully_shard's parameters (DTensors), against one process on the whole batch.

Usage: fully_sharded_torch_apis.py CASE[,CASE...], where the cases that take a directory are written
CASE=DIRECTORY. Each case prints 'ok CASE' on every rank.
No case calls dist.init_process_group: hvd.init() and fully_shard make the group the meshes need.

- clip: torch.nn.utils.clip_grad_norm_ (2 and inf) and get_total_norm give the whole model's norm.
- model_state_dict: DCP's get_model_state_dict (full_state_dict, with and without cpu_offload) gives the
  whole tensors; set_model_state_dict (broadcast_from_rank0) loads them into another sharded model.
- optimizer_state_dict: get/set_optimizer_state_dict (full_state_dict) round-trip Adam's state; training
  on from the loaded state matches one process.
- full_tensor: every parameter's and gradient's full_tensor() is the one-process tensor.
- unshard: model.unshard() registers the root's full parameters (plain tensors); reshard() the shards.
- hybrid (np=4): hybrid sharding's parameters are (Replicate(), Shard(0)) on a 2 x 2 mesh; norm and state dict.
- device_mesh (first, alone): init_device_mesh after hvd.init() alone runs on hvdlite's backend.
- collectives_refuse: hvdlite's own collectives refuse a DTensor, naming it and what to call instead.
- dcp_save=DIRECTORY: dcp.save of the sharded model and Adam state (and the one-process reference);
- dcp_load=DIRECTORY (at another number of ranks): dcp.load into hvd.fully_shard's model, into torch's
  own fully_shard (FSDP2) model, saved again from FSDP2 and loaded back into hvdlite's: all equal.
"""

import copy
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from fully_sharded_common import assert_matches, batches, build, shard, step_both
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor, Replicate, Shard

import hvdlite.torch as hvd
from hvdlite.torch.distributed import ProcessGroupHvdlite

FULL = StateDictOptions(full_state_dict=True)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, tolerance: float = 1e-5) -> None:
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    error = (actual.cpu() - expected.cpu()).abs().max().item() if actual.numel() else 0.0
    assert error <= tolerance, f"{what} differs from the one-process reference by {error}"


def whole(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def trained(steps: int = 2, optimizer=torch.optim.Adam) -> tuple:
    """A sharded model and the one-process reference, ``steps`` steps of ``optimizer`` each."""
    reference = build()
    model = shard(copy.deepcopy(reference))
    optimizers = tuple(optimizer(m.parameters(), lr=0.01) for m in (reference, model))
    for x, y in list(batches())[:steps]:
        step_both(reference, model, optimizers, x, y)
    return reference, model, optimizers


def clip() -> None:
    reference = build()
    model = shard(copy.deepcopy(reference))
    optimizers = tuple(torch.optim.SGD(m.parameters(), lr=0.1) for m in (reference, model))
    for step, (x, y) in enumerate(batches()):
        norm_type = 2.0 if step % 2 == 0 else float("inf")
        for optimizer in optimizers:
            optimizer.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        torch.nn.functional.mse_loss(model(x[hvd.rank() * 6:(hvd.rank() + 1) * 6]),
                                     y[hvd.rank() * 6:(hvd.rank() + 1) * 6]).backward()
        total = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()], norm_type)
        expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05, norm_type)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05, norm_type)
        assert_close(whole(norm), expected, f"clip_grad_norm_ ({norm_type}) at step {step}")
        assert_close(whole(total), expected, f"get_total_norm ({norm_type}) at step {step}")
        assert isinstance(norm, DTensor), type(norm)  # as FSDP2's: a replicated DTensor
        for optimizer in optimizers:
            optimizer.step()
    assert_matches(model, reference, "clip")


def model_state_dict() -> None:
    reference, model, _ = trained()
    expected = reference.state_dict()
    full = get_model_state_dict(model, options=FULL)
    assert list(full) == list(expected), (list(full), list(expected))
    for key, value in expected.items():
        assert not isinstance(full[key], DTensor), key
        assert_close(full[key], value, f"get_model_state_dict['{key}']")
    offloaded = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    assert (list(offloaded) == list(expected)) if hvd.rank() == 0 else offloaded == {}, list(offloaded)
    other = shard(build(seed=5))
    set_model_state_dict(other, offloaded, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    assert_matches(other, reference, "model_state_dict")


def optimizer_state_dict() -> None:
    reference, model, (reference_optimizer, optimizer) = trained()
    expected = get_optimizer_state_dict(reference, reference_optimizer, options=FULL)
    full = get_optimizer_state_dict(model, optimizer, options=FULL)
    assert sorted(full["state"]) == sorted(expected["state"]), (sorted(full["state"]), sorted(expected["state"]))
    for key, state in expected["state"].items():
        for name, value in state.items():
            assert_close(torch.as_tensor(full["state"][key][name]), torch.as_tensor(value), f"Adam {name} of {key}")
    other = shard(build(seed=5))
    set_model_state_dict(other, get_model_state_dict(model, options=FULL), options=FULL)
    other_optimizer = torch.optim.Adam(other.parameters(), lr=0.5)  # the loaded param groups set lr back
    set_optimizer_state_dict(other, other_optimizer, full, options=FULL)
    assert other_optimizer.param_groups[0]["lr"] == 0.01
    for x, y in list(batches())[2:]:
        step_both(reference, other, (reference_optimizer, other_optimizer), x, y)
    assert_matches(other, reference, "optimizer_state_dict")


def full_tensor() -> None:
    reference, model, _ = trained(optimizer=torch.optim.SGD)
    x, y = next(iter(batches()))
    step_both(reference, model, (torch.optim.SGD(reference.parameters(), lr=0),
                                 torch.optim.SGD(model.parameters(), lr=0)), x, y)  # fresh gradients, no change
    for (name, param), expected in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert isinstance(param, DTensor) and param.placements == (Shard(0),), (name, param)
        assert param.shape == expected.shape and param.device_mesh.size() == hvd.size(), name
        assert_close(param.full_tensor(), expected, f"{name}.full_tensor()")
        assert_close(param.grad.full_tensor(), expected.grad, f"{name}.grad.full_tensor()")


def unshard() -> None:
    reference, model, _ = trained()
    model.unshard()
    # the root unit holds the parameters of the LayerNorm and the head (modules 3 and 4), the blocks their own
    expected = {name: p for name, p in reference.named_parameters() if name.split(".")[0] in ("3", "4")}
    root_params = {name: p for name, p in model.named_parameters() if name.split(".")[0] in ("3", "4")}
    assert sorted(root_params) == sorted(expected), (sorted(root_params), sorted(expected))
    for name, param in root_params.items():
        assert not isinstance(param, DTensor), (name, type(param))  # the full parameter, as FSDP2's
        assert_close(param.detach(), expected[name], f"unsharded {name}")
    assert isinstance(model[0][0].weight, DTensor)  # the blocks' units stay sharded
    model.reshard()
    assert all(isinstance(p, DTensor) for p in model.parameters())


def collectives_refuse() -> None:
    """hvdlite's own collectives take whole tensors: a DTensor is refused by name, on every rank."""
    _, model, _ = trained(steps=1)
    for call in (lambda: hvd.broadcast_parameters(model.state_dict(), root_rank=0),
                 lambda: hvd.allreduce(model[0][0].weight, name="weight")):
        try:
            call()
        except hvd.UnsupportedOperationError as error:
            assert "is a DTensor (placements (Shard(dim=0),)" in str(error) and "hvd.full_state_dict" in str(error), error
        else:
            raise AssertionError("a DTensor went through one of hvdlite's collectives")


def hybrid() -> None:
    """Sharded within {0, 1} and {2, 3}, replicated across {0, 2} and {1, 3} (np=4): the parameters are
    (Replicate(), Shard(0)) DTensors on a 2-D mesh, and torch's norm and full state dict are right."""
    shard_sets = [hvd.add_process_set(ranks) for ranks in ([0, 1], [2, 3])]  # every rank registers every set
    replica_sets = [hvd.add_process_set(ranks) for ranks in ([0, 2], [1, 3])]
    shard_set, replica_set = shard_sets[hvd.rank() // 2], replica_sets[hvd.rank() % 2]
    reference = build()
    model = shard(copy.deepcopy(reference), process_set=shard_set, replicate_process_set=replica_set)
    param = model[0][0].weight
    assert param.placements == (Replicate(), Shard(0)), param.placements
    assert param.device_mesh.mesh.tolist() == [[0, 1], [2, 3]], param.device_mesh.mesh.tolist()
    optimizers = tuple(torch.optim.Adam(m.parameters(), lr=0.01) for m in (reference, model))
    for x, y in batches():
        step_both(reference, model, optimizers, x, y)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1e9)
    assert_close(whole(norm), expected, "clip_grad_norm_ on the 2-D mesh")
    full = get_model_state_dict(model, options=FULL)
    for key, value in reference.state_dict().items():
        assert_close(full[key], value, f"get_model_state_dict['{key}'] on the 2-D mesh")


def device_mesh() -> None:
    """After hvd.init() alone, torch's init_device_mesh starts the default group on hvdlite's backend."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    mesh = init_device_mesh("cpu", (hvd.size(),))
    assert isinstance(dist.group.WORLD, ProcessGroupHvdlite), dist.get_backend_config()
    whole = torch.arange(35, dtype=torch.float32).reshape(7, 5)
    tensor = distribute_tensor(whole, mesh, [Shard(0)])
    assert_close(tensor.full_tensor(), whole, "distribute_tensor(...).full_tensor()")
    _, model, _ = trained(steps=1)  # hvd.fully_shard on the same default group
    assert model[0][0].weight.device_mesh.get_group() is dist.group.WORLD


def dcp_save(directory: str) -> None:
    reference, model, (_, optimizer) = trained()
    dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)},
             checkpoint_id=os.path.join(directory, "hvdlite"))
    if hvd.rank() == 0:
        torch.save(reference.state_dict(), os.path.join(directory, "reference.pt"))


def _load_into(model: torch.nn.Module, path: str) -> torch.optim.Optimizer:
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])
    return optimizer


def _assert_equals_reference(model: torch.nn.Module, expected: dict, what: str) -> None:
    full = get_model_state_dict(model, options=FULL)
    for key, value in expected.items():
        assert_close(full[key], value, f"{what}: {key}")


def dcp_load(directory: str) -> None:
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    expected = torch.load(os.path.join(directory, "reference.pt"), weights_only=True)
    model = shard(build(seed=5))
    _load_into(model, os.path.join(directory, "hvdlite"))
    _assert_equals_reference(model, expected, "hvdlite model from hvdlite's checkpoint")
    theirs = build(seed=6)
    for block in list(theirs)[:-2]:
        torch_fully_shard(block)
    torch_fully_shard(theirs)
    optimizer = _load_into(theirs, os.path.join(directory, "hvdlite"))
    _assert_equals_reference(theirs, expected, "torch FSDP2 model from hvdlite's checkpoint")
    dcp.save({"model": get_model_state_dict(theirs), "optim": get_optimizer_state_dict(theirs, optimizer)},
             checkpoint_id=os.path.join(directory, "fsdp2"))
    back = shard(build(seed=7))
    _load_into(back, os.path.join(directory, "fsdp2"))
    _assert_equals_reference(back, expected, "hvdlite model from torch FSDP2's checkpoint")


CASES = {"clip": clip, "model_state_dict": model_state_dict, "optimizer_state_dict": optimizer_state_dict,
         "full_tensor": full_tensor, "unshard": unshard, "collectives_refuse": collectives_refuse}
WITH_DIRECTORY = {"dcp_save": dcp_save, "dcp_load": dcp_load}
CASES["hybrid"] = hybrid  # (np=4 only)
CASES["device_mesh"] = device_mesh  # (first: before any case starts the default group)


def main() -> None:
    hvd.init(process_sets="dynamic")  # the hybrid case adds its sets
    for item in sys.argv[1].split(","):
        case, _, directory = item.partition("=")
        if case in WITH_DIRECTORY:
            WITH_DIRECTORY[case](directory)
        else:
            CASES[case]()
        print(f"ok {case}", flush=True)
    assert isinstance(dist.group.WORLD, ProcessGroupHvdlite)  # the default group fully_shard (or torch) started


if __name__ == "__main__":
    main()
