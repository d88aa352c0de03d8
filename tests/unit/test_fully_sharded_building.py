"""Building fully sharded units, in-process (it needs no collective; training is tested with real
ranks in tests/multirank/test_fully_sharded.py): which unit holds a parameter tied across
fully_shard calls, and optimizers holding parameters fully_shard replaced are refused.

The shards' device mesh is torch's in-process fake group (rank 0 of 2): building a unit sends
nothing over it."""

import copy

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from hvdlite.torch.fully_sharded import shard as shard_module
from hvdlite.torch.fully_sharded.shard import fully_shard
from hvdlite.torch.fully_sharded.ties import check_none_waiting


@pytest.fixture(autouse=True)
def fake_mesh(monkeypatch):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    monkeypatch.setattr(shard_module, "mesh_for", lambda *_args: mesh)


class FakeSet:
    """What building a unit asks of a process set: rank 0 of two ranks."""

    def __init__(self, ranks=(0, 1)):
        self.ranks = list(ranks)

    def size(self):
        return len(self.ranks)

    def rank(self):
        return 0

    def included(self):
        return True


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.block = torch.nn.Linear(3, 3)
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight


def unit_params(module):
    return [(p.owners[0][1], tuple(p.full.shape)) for p in module._hvdlite_unit.params]


@pytest.mark.parametrize("wrapped", [[], ["embed"], ["head"], ["embed", "head"], ["head", "embed", "block"]])
def test_the_lowest_unit_holding_every_use_holds_the_tied_parameter(wrapped):
    model, ranks = Tied(), FakeSet()
    for name in wrapped:
        fully_shard(getattr(model, name), process_set=ranks)
    fully_shard(model, process_set=ranks)
    tied = [p for p in model._hvdlite_unit.params if len(p.owners) == 2]
    assert len(tied) == 1 and {(id(m), a) for m, a in tied[0].owners} == {(id(model.embed), "weight"),
                                                                       (id(model.head), "weight")}
    assert model.embed.weight is model.head.weight is tied[0].shard and tied[0].shard.shape == (5, 3)
    assert tied[0].local.shape == (3, 3)  # rank 0 of 2: rows 0-2 of 5
    for name in wrapped:  # the inner units gave it up, and their layouts no longer count it
        unit = getattr(model, name)._hvdlite_unit
        assert tied[0] not in unit.params and len(unit.layout.params) == len(unit.params)
        assert tied[0].holder is model._hvdlite_unit
    check_none_waiting(model, [m._hvdlite_unit for m in model.modules() if hasattr(m, "_hvdlite_unit")])


def test_a_tie_between_sibling_units_waits_and_is_refused_if_nothing_takes_it():
    model, ranks = Tied(), FakeSet()
    fully_shard(model.embed, process_set=ranks)
    fully_shard(model.head, process_set=ranks)
    assert unit_params(model.embed) == [] and unit_params(model.head) == []
    with pytest.raises(ValueError, match=r"\[\['Embedding.weight', 'Linear.weight'\]\] belong to no unit"):
        check_none_waiting(model.embed, [model.embed._hvdlite_unit])


def test_a_shard_tied_after_sharding_moves_to_the_enclosing_unit():
    model, ranks = Tied(), FakeSet()
    model.head.weight = torch.nn.Parameter(torch.zeros(5, 3))
    fully_shard(model.embed, process_set=ranks)
    model.head.weight = model.embed.weight  # the shard itself
    fully_shard(model, process_set=ranks)
    assert [name for name, _ in unit_params(model)] == ["weight", "bias", "weight"]  # block's, then the tied one
    assert model.head.weight is model.embed.weight and unit_params(model.embed) == []


def test_a_tie_across_process_sets_is_refused_by_name():
    model = Tied()
    fully_shard(model.embed, process_set=FakeSet((0, 1)))
    with pytest.raises(ValueError, match="parameter 'embed.weight' is tied to a unit sharded over"):
        fully_shard(model, process_set=FakeSet((0, 2)))


def test_an_optimizer_built_before_fully_shard_is_refused_at_its_step():
    model = Tied()
    early = torch.optim.SGD(model.parameters(), lr=0.1)
    fully_shard(model, process_set=FakeSet())
    with pytest.raises(ValueError, match=r"SGD: its parameter 0 \(shape \(5, 3\)\) is no longer on the model: "
                                         "fully_shard put its shard in its place. Build the optimizer after"):
        early.step()
    torch.optim.SGD(model.parameters(), lr=0.1).step()  # built after: steps


def test_to_empty_keeps_the_shard_parameters_so_an_optimizer_built_before_it_steps_them():
    # The shards are DTensors, which Module._apply swaps in place (torch.utils.swap_tensors), as FSDP2's:
    # an optimizer built on the meta device holds the Parameters that to_empty filled.
    with torch.device("meta"):
        model = Tied()
    fully_shard(model, process_set=FakeSet())
    early = torch.optim.Adam(model.parameters())
    before = list(model.parameters())
    model.to_empty(device="cpu")
    assert [p is q for p, q in zip(model.parameters(), before, strict=True)] == [True] * len(before)
    assert all(p.device.type == "cpu" and not p.is_meta for p in model.parameters())
    early.step()


def test_an_optimizer_holding_a_parameter_fully_shard_replaced_is_checked_again_when_it_grows():
    model = Tied()
    original = model.block.weight
    fully_shard(model, process_set=FakeSet())
    later = torch.optim.Adam(model.parameters())
    later.step()
    later.add_param_group({"params": [original]})  # checked again when it grows
    with pytest.raises(ValueError, match="Adam: its parameter 3"):
        later.step()


def test_a_tie_between_units_that_both_offload_resolves():
    # Without CUDA, offloading changes nothing, so the two units compute in the same place.
    model, ranks = Tied(), FakeSet()
    fully_shard(model.embed, process_set=ranks, offload="cpu")
    fully_shard(model, process_set=ranks, offload="cpu")
    assert [len(p.owners) for p in model._hvdlite_unit.params] == [1, 1, 2]


def test_a_deep_copy_has_its_own_shards_ties_and_empty_full_parameters():
    model, ranks = Tied(), FakeSet()
    fully_shard(model.embed, process_set=ranks)
    fully_shard(model, process_set=ranks)
    twin = copy.deepcopy(model)
    assert twin.embed.weight is twin.head.weight and twin.embed.weight is not model.embed.weight
    assert torch.equal(twin.embed.weight, model.embed.weight)
    for copied, original in zip(twin._hvdlite_unit.params, model._hvdlite_unit.params, strict=True):
        assert copied.holder is twin._hvdlite_unit and copied.process_set is original.process_set
        assert copied.full is not original.full and copied.full.untyped_storage().size() == 0
        assert all(any(m is owner for m in twin.modules()) for owner, _ in copied.owners)
