"""DiLoCo with real ranks: every rank's parameters after every step against a replay in one process.

Usage: torch_diloco.py GROUP_SIZE RUN,... Ranks form groups of GROUP_SIZE consecutive ranks. Inside a
group the ranks train synchronously (a DistributedOptimizer over the group's set, SGD with momentum;
``sharded`` runs: the model ``fully_shard``-ed over the group, a plain SGD); across groups DiLoCo
averages pseudo-gradients over the ranks holding the same place in each group and steps a Nesterov
outer SGD (lr 0.7, momentum 0.9). RUN is ``MODE[/FRAGMENTS/DELAY[/COMPRESSION]]`` with MODE ``plain``,
``sharded`` or ``wide`` (as plain, DiLoCo's set being every rank). In ``plain`` groups of two or more,
the rank at place i of a group exchanges slice i of each fragment (it must: the test checks) and the
group all-gathers the averaged slices; the replay rounds int8 slice by slice then. Rank r computes its gradient on its own batch (x = r + 1 + step/10).

The replay keeps one model per group (its ranks step alike on their averaged gradient), one global
model and one outer optimizer; fragment p is sent after steps (p + 1) * H / F + k * H and lands
DELAY steps later as ``new global + local progress since it was sent``. With ``int8``/``bf16`` the
replay rounds each group's pseudo-gradient with the library's codec (error feedback included).
A run checks a checkpoint too: the DiLoCo state is saved at step CHECKPOINT_AT, training goes on,
then a fresh DiLoCo loads it and repeats the rest, which must end the same.
Prints 'ok diloco RUN RANK' per run.
"""

import copy
import sys

import torch
from diloco_common import ReplaySchedule, expect_refusal, make_sets

import hvdlite.torch as hvd
from hvdlite.torch.slow_links.diloco_exchange import SlicedExchange, dequantize_int8, quantize_int8
from hvdlite.training.diloco import DiLoCoSchedule, split_fragments

SYNC_EVERY, STEPS, CHECKPOINT_AT = 4, 13, 6


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3), torch.nn.Tanh(),
                               torch.nn.Linear(3, 1))


def loss_of(model: torch.nn.Module, rank: int, step: int) -> torch.Tensor:
    x = torch.linspace(-1, 1, 8).view(2, 4) * (rank + 1 + step / 10)
    return ((model(x) - (rank % 3)) ** 2).mean()


def outer_of(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)


def inner_of(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.5)


def inner_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ranks, step: int) -> None:
    """A group's synchronous step: the mean of its ranks' gradients."""
    grads = []
    for rank in ranks:
        model.zero_grad()
        loss_of(model, rank, step).backward()
        grads.append([param.grad.clone() for param in model.parameters()])
    for index, param in enumerate(model.parameters()):
        param.grad = torch.stack([g[index] for g in grads]).mean(0)
    optimizer.step()


def outer_step(global_model: torch.nn.Module, outer: torch.optim.Optimizer, models: list[torch.nn.Module]) -> None:
    """DiLoCo's sync: the outer step on the groups' mean pseudo-gradient; every group starts from it."""
    with torch.no_grad():
        for index, param in enumerate(global_model.parameters()):
            param.grad = torch.stack([param - list(m.parameters())[index] for m in models]).mean(0)
        outer.step()
        for model in models:
            for param, value in zip(model.parameters(), global_model.parameters(), strict=True):
                param.copy_(value)


class Replay(ReplaySchedule):
    """Every group's model after every step, with DiLoCo's outer steps, in this process."""

    def __init__(self, size: int, group_size: int, fragments: int, delay: int, compression: str,
                 slices: int) -> None:
        self.groups = [list(range(g, g + group_size)) for g in range(0, size, group_size)]
        self.models = [make_model() for _ in self.groups]
        self.inner = [inner_of(m.parameters()) for m in self.models]
        self.global_model = make_model()
        self.outer = outer_of(self.global_model.parameters())
        self.schedule = DiLoCoSchedule(SYNC_EVERY, fragments, delay)
        self.fragments = split_fragments([p.numel() for p in self.global_model.parameters()], fragments)
        self.compression, self.residuals, self.slices = compression, {}, slices
        self.flight = None

    def step(self, step: int) -> None:
        for model, optimizer, ranks in zip(self.models, self.inner, self.groups, strict=True):
            inner_step(model, optimizer, ranks, step)
        self.after_step(step)

    def params(self, model: torch.nn.Module, fragment: int) -> list[torch.Tensor]:
        every = list(model.parameters())
        return [every[i] for i in self.fragments[fragment]]

    def send(self, fragment: int) -> None:
        with torch.no_grad():
            deltas = [[g - p for g, p in zip(self.params(self.global_model, fragment), self.params(m, fragment),
                                               strict=True)] for m in self.models]
            deltas = [self.rounded(group, fragment, ds) for group, ds in enumerate(deltas)]
            average = [torch.stack(ds).mean(0) for ds in zip(*deltas, strict=True)]
            anchors = [[p.clone() for p in self.params(m, fragment)] for m in self.models]
        self.flight = (fragment, average, anchors)

    def rounded(self, group: int, fragment: int, deltas: list[torch.Tensor]) -> list[torch.Tensor]:
        """A group's ``deltas`` as the codec delivers them: int8 with error feedback, per parameter, or
        per slice of the flattened fragment where each rank of a group of replicas sends its slice."""
        if self.compression == "bf16":
            return [delta.to(torch.bfloat16).float() for delta in deltas]
        if self.compression != "int8":
            return deltas
        if self.slices == 1:
            return [self.int8((group, fragment, index), delta.reshape(-1)).view_as(delta)
                    for index, delta in enumerate(deltas)]
        flat = torch.cat([delta.reshape(-1) for delta in deltas])
        width = -(-flat.numel() // self.slices)
        padded = torch.nn.functional.pad(flat, (0, width * self.slices - flat.numel()))
        decoded = torch.cat([self.int8((group, fragment, place), padded[place * width:(place + 1) * width])
                             for place in range(self.slices)])[:flat.numel()]
        return [part.view_as(delta) for part, delta in zip(decoded.split([d.numel() for d in deltas]), deltas,
                                                           strict=True)]

    def int8(self, key: tuple, flat: torch.Tensor) -> torch.Tensor:
        corrected = flat + self.residuals.get(key, 0)
        decoded = dequantize_int8(*quantize_int8(corrected), corrected.numel())
        self.residuals[key] = corrected - decoded
        return decoded

    def land(self) -> None:
        fragment, average, anchors = self.flight
        outer_params = self.params(self.global_model, fragment)
        for param in self.global_model.parameters():
            param.grad = None
        for param, mean in zip(outer_params, average, strict=True):
            param.grad = mean.clone()
        self.outer.step()
        with torch.no_grad():
            for model, anchor in zip(self.models, anchors, strict=True):
                for param, own, new in zip(self.params(model, fragment), anchor, outer_params, strict=True):
                    param.copy_(new + (param - own))

    def flat(self, group: int) -> torch.Tensor:
        return torch.cat([p.detach().flatten() for p in self.models[group].parameters()])


def full_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().flatten()
                      for p in model.parameters()])


def build(mode: str, group_set, cross_set, fragments: int, delay: int, compression: str | None):
    model = make_model()
    if mode == "sharded":
        hvd.fully_shard(model, process_set=group_set)
        inner = inner_of(model.parameters())
    else:
        inner = hvd.DistributedOptimizer(inner_of(model.parameters()), named_parameters=model.named_parameters(),
                                         process_set=group_set)
    diloco = hvd.DiLoCo(model, inner, outer_of(model.parameters()), sync_every=SYNC_EVERY, process_set=cross_set,
                        fragments=fragments, delay=delay, compression=compression)
    return model, diloco


def check_refusals(group_size: int, sets: dict) -> None:
    """What DiLoCo cannot run is a ValueError on every rank, naming what is wrong."""
    rank, size = hvd.rank(), hvd.size()
    group_set = sets["group"][rank // group_size]
    model = make_model()
    local_sgd = hvd.DistributedOptimizer(inner_of(model.parameters()), named_parameters=model.named_parameters(),
                                         process_set=group_set, local_sgd_period=4)
    expect_refusal("DistributedOptimizer with local_sgd_period set",
                   lambda: hvd.DiLoCo(model, local_sgd, outer_of(model.parameters()), sync_every=4))
    model = make_model()
    outer = hvd.DistributedOptimizer(outer_of(model.parameters()), named_parameters=model.named_parameters(),
                                     process_set=group_set)
    expect_refusal("outer_optimizer must be a plain torch optimizer",
                   lambda: hvd.DiLoCo(model, inner_of(model.parameters()), outer, sync_every=4))
    model = make_model()
    every = 4 if rank == 0 else 8  # rank 0 disagrees with every other rank
    expect_refusal(f"the schedule (sync_every, fragments, delay) differs across the process set {list(range(size))}: "
                   "rank 0 has (4, 1, 0), "
                   "rank 1 has (8, 1, 0)",
                   lambda: hvd.DiLoCo(model, inner_of(model.parameters()), outer_of(model.parameters()),
                                      sync_every=every))
    others = sets["group"][(rank // group_size + 1) % len(sets["group"])]
    expect_refusal(f"this rank is not in DiLoCo's process_set {others.ranks}",
                   lambda: hvd.DiLoCo(model, inner_of(model.parameters()), outer_of(model.parameters()),
                                      sync_every=4, process_set=others))
    plain = hvd.DiLoCo(model, inner_of(model.parameters()), outer_of(model.parameters()), sync_every=4)
    expect_refusal("regroup(inner_process_set=...) needs an inner DistributedOptimizer",
                   lambda: plain.regroup(hvd.global_process_set, inner_process_set=group_set))
    expect_refusal(f"this rank is not in DiLoCo's process_set {others.ranks}", lambda: plain.regroup(others))
    if group_size > 1:  # a model fully_shard-ed over its group cannot be elastic state (yet): refused
        sharded_model, sharded = build("sharded", group_set, sets["cross"][rank % group_size], 1, 0, None)
        expect_refusal("elastic re-sharding supports units sharded over the global process set only",
                       lambda: hvd.elastic.TorchState(sharded_model, sharded))
    print(f"ok diloco refusals {rank}", flush=True)


def check(run: str, group_size: int, sets: dict) -> None:
    if run == "refusals":
        return check_refusals(group_size, sets)
    mode, *rest = run.split("/")
    fragments, delay = (int(rest[0]), int(rest[1])) if rest else (1, 0)
    compression = rest[2] if len(rest) > 2 else None
    rank, size = hvd.rank(), hvd.size()
    group_set, cross_set = sets["group"][rank // group_size], sets["cross"][rank % group_size]
    if mode == "wide":  # pseudo-gradients averaged over every rank, not between places
        cross_set = hvd.global_process_set
    model, diloco = build(mode, group_set, cross_set, fragments, delay, compression)
    # Replicas in groups of two or more exchange one slice each (sharded models: each rank its shard).
    sliced = mode == "plain" and group_size > 1  # not "wide": its set spans places

    assert isinstance(diloco._exchange, SlicedExchange) == sliced, (run, type(diloco._exchange))
    replay = Replay(size, group_size, fragments, delay, compression or "", group_size if sliced else 1)
    saved = None
    for step in range(STEPS):
        if step == CHECKPOINT_AT:
            saved = (copy.deepcopy(diloco.state_dict()), copy.deepcopy(model.state_dict()),
                     copy.deepcopy(diloco.inner_optimizer.state_dict()), replay.flat(rank // group_size))
        diloco.zero_grad()
        loss_of(model, rank, step).backward()
        diloco.step()
        replay.step(step)
        mine, want = full_params(model), replay.flat(rank // group_size)
        assert torch.allclose(mine, want, atol=1e-5), (run, rank, step, (mine - want).abs().max().item())
    final = full_params(model)
    resumed_model, resumed = build(mode, group_set, cross_set, fragments, delay, compression)
    resumed_model.load_state_dict(saved[1])
    resumed.inner_optimizer.load_state_dict(saved[2])
    resumed.load_state_dict(saved[0])
    for step in range(CHECKPOINT_AT, STEPS):
        resumed.zero_grad()
        loss_of(resumed_model, rank, step).backward()
        resumed.step()
    again = full_params(resumed_model)
    assert torch.allclose(again, final, atol=1e-6), (run, rank, "resumed", (again - final).abs().max().item())
    assert diloco.syncs == resumed.syncs == len([c for c in range(1, STEPS + 1)
                                                 if replay.schedule.lands_after(c) is not None])
    print(f"ok diloco {run} {rank}", flush=True)


def main() -> None:
    torch.set_num_threads(1)
    from mpi4py import MPI

    size, group_size = MPI.COMM_WORLD.Get_size(), int(sys.argv[1])
    sets = make_sets(hvd, size, group_size)
    for run in sys.argv[2].split(","):
        check(run, group_size, sets)
    hvd.shutdown()


if __name__ == "__main__":
    main()
