"""fully_shard against one process training on the whole batch, case by case, in one job.

Usage: fully_sharded.py CASE[,CASE...] [DIRECTORY] (save_sharded and load_sharded: the checkpoint's). Each case builds the same model twice: a plain copy trained
on the whole batch in this process (the reference), and a fully sharded one trained on this rank's
slice; after several steps every parameter must match the reference to 1e-5. Every rank prints
'ok <case>'. The model has row counts that no rank count divides (7 and 3 rows), so shards are uneven.
FULLY_SHARDED_DEVICE=cuda builds both models and the data on the GPU (tests/gpu).
"""

import copy
import sys

import torch
from fully_sharded_common import (
    BATCH,
    DEVICE,
    TOLERANCE_BF16,
    assert_matches,
    batches,
    build,
    loss_of,
    mine,
    mine_of,
    shard,
)
from fully_sharded_wrapping import WRAPPING_CASES, load_tied, save_tied
from torch.distributed.tensor import DTensor

import hvdlite.torch as hvd


def train(case: str, optimizer_class=torch.optim.SGD, accumulate: int = 1, no_sync: bool = False,
          clip: float | None = None, wrap: bool = False, **options) -> None:
    reference = build()
    model = shard(copy.deepcopy(reference), **options)
    if case == "prefetch_off":
        for module in model.modules():
            if isinstance(module, hvd.FullyShardedModule):
                module.set_modules_to_forward_prefetch([])
                module.set_modules_to_backward_prefetch([])
    settings = {"lr": 0.05} if optimizer_class is torch.optim.SGD else {"lr": 0.01}
    reference_optimizer = optimizer_class(reference.parameters(), **settings)
    optimizer = optimizer_class(model.parameters(), **settings)
    if wrap:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    for x, y in batches():
        reference_optimizer.zero_grad()
        optimizer.zero_grad()
        for part in range(accumulate):  # micro-batches: the reference sums the same losses
            cut = slice(part * BATCH // accumulate, (part + 1) * BATCH // accumulate)
            (loss_of(reference, torch.cat([mine_of(x, r)[cut] for r in range(hvd.size())]),
                     torch.cat([mine_of(y, r)[cut] for r in range(hvd.size())])) / accumulate).backward()
            if no_sync:
                model.set_requires_gradient_sync(part == accumulate - 1)
            loss = loss_of(model, mine(x)[cut], mine(y)[cut]) / accumulate
            # between forward and backward a block holds its shards only, unless told to keep more
            kept = {True: "SHARDED", False: "UNSHARDED"}.get(options.get("reshard_after_forward", True), "GROUP_SHARDED")
            assert model[0]._hvdlite_unit.state.name == kept, (case, model[0]._hvdlite_unit.state)
            loss.backward()
        if clip is not None:
            expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), clip)
            norm = hvd.clip_grad_norm_(model.parameters(), clip)
            assert abs(norm.item() - expected.item()) <= 1e-5 * max(1.0, expected.item()), (norm, expected)
        reference_optimizer.step()
        optimizer.step()
    if options.get("offload"):  # shards, gradients and optimizer state in host memory; computed on DEVICE
        assert all(p.device.type == "cpu" and p.grad.device.type == "cpu" for p in model.parameters()), case
        assert all(v.device.type == "cpu" for state in optimizer.state.values() for v in state.values()), case
        assert loss.device == x.device, (loss.device, x.device)
    assert_matches(model, reference, case)


def mixed_precision(case: str, reduce_dtype: torch.dtype | None) -> None:
    """bf16 compute, fp32 shards. The reference does by hand what the policy promises: each rank's
    slice through a bf16 copy of the fp32 weights, the gradients averaged in ``reduce_dtype`` (in
    float32 and rounded once, as hvdlite reduces 16-bit floats), the fp32 weights stepped."""
    low_dtype = torch.bfloat16
    reference = build()
    model = shard(copy.deepcopy(reference), mp_policy=hvd.MixedPrecisionPolicy(low_dtype, reduce_dtype))
    seen = []
    model[0].register_forward_pre_hook(lambda module, args: seen.append((module[0].weight.dtype, args[0].dtype)))
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in batches():
        reference_optimizer.zero_grad()  # (a deep copy would carry the last step's gradients)
        grads = []
        for rank in range(hvd.size()):
            low = copy.deepcopy(reference).to(low_dtype)
            loss_of(low, mine_of(x, rank).to(low_dtype), mine_of(y, rank)).backward()
            grads.append([p.grad.float() for p in low.parameters()])
        for index, param in enumerate(reference.parameters()):
            average = sum(g[index] for g in grads) / hvd.size()
            param.grad = average.to(reduce_dtype or low_dtype).float()
        reference_optimizer.step()
        optimizer.zero_grad()
        loss_of(model, mine(x), mine(y)).backward()
        optimizer.step()
    assert seen[0] == (low_dtype, low_dtype), seen[0]  # gathered and computed in bf16, inputs cast
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    # bf16 rounding: an ulp of difference in a float32 sum (the ranks' order) can round a gradient
    # or a weight's bf16 copy the other way, which moves a weight by ~lr * 2^-8 * |gradient|.
    assert_matches(model, reference, case, tolerance=TOLERANCE_BF16)


def hybrid() -> None:
    """Shard within sets of 2 ranks (1 at an odd size), replicate across them: the same training.
    (At np=2 that is one set of two and no replica but itself; np=4 is the real 2 x 2 case.)"""
    width = 2 if hvd.size() % 2 == 0 else 1
    added = []

    def process_set(ranks: list[int]):
        if len(ranks) == hvd.size():
            return hvd.global_process_set
        added.append(hvd.add_process_set(ranks))
        return added[-1]

    shard_sets = [process_set(list(range(k, k + width))) for k in range(0, hvd.size(), width)]
    replica_sets = [process_set(list(range(j, hvd.size(), width))) for j in range(width)]
    mine_shard = next(s for s in shard_sets if s.included())
    mine_replica = next(s for s in replica_sets if s.included())
    train("hybrid", torch.optim.Adam, process_set=mine_shard, replicate_process_set=mine_replica)
    if 1 < width < hvd.size():
        refused("replicas that are not one per shard set", lambda: hvd.fully_shard(
            build(), process_set=mine_shard, replicate_process_set=hvd.global_process_set), "must cross in exactly")
    for each in added:
        hvd.remove_process_set(each)


def group_reshard() -> None:
    """reshard_after_forward=2 at np=4: between forward and backward each rank keeps 1/2 of a unit
    (sharded within {0, 1} or {2, 3}), backward gathers within the pair; the same training."""
    train("group_reshard", torch.optim.Adam, reshard_after_forward=2)
    model = shard(build(), reshard_after_forward=2)
    out = model(torch.ones(2, 7))
    unit = model[0]._hvdlite_unit
    assert unit.state.name == "GROUP_SHARDED" and unit._group_rows.numel() == unit.group_layout.shard_numel
    assert unit.group_layout.shard_numel * 2 >= unit.layout.shard_numel * hvd.size() // 2
    out.sum().backward()
    assert unit.state.name == "SHARDED" and unit._group_rows is None


def frozen() -> None:
    """A unit with frozen parameters among trainable ones: they keep their value and get no gradient;
    then one is unfrozen and another frozen through the shards (after fully_shard), and both models
    train on alike."""
    reference = build()
    reference[1][0].bias.requires_grad_(False)
    reference[1][2].weight.requires_grad_(False)
    model = shard(copy.deepcopy(reference))
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)  # frozen ones have no gradient: not stepped
    for step, (x, y) in enumerate(batches()):
        if step == 2:
            for each in (reference, model):
                each[1][2].weight.requires_grad_(True)
                each[0][0].weight.requires_grad_(False)
        for opt in (reference_optimizer, optimizer):
            opt.zero_grad()
        loss_of(reference, x, y).backward()
        loss_of(model, mine(x), mine(y)).backward()
        if step == 1:
            assert model[1][0].bias.grad is None and model[1][2].weight.grad is None
        reference_optimizer.step()
        optimizer.step()
    assert model[1][0].bias.grad is None and model[0][0].weight.grad is None
    assert_matches(model, reference, "frozen")


def evaluation() -> None:
    """no_grad and eval(): the same outputs as the plain model, every unit sharded afterwards."""
    reference = build()
    model = shard(copy.deepcopy(reference))
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    model.eval()
    with torch.no_grad():
        out = model(x)
    assert torch.allclose(out, reference(x), atol=1e-6), (out, reference(x))
    shapes = [tuple(p.to_local().shape) for p in model.parameters()]
    rows = -(-7 // hvd.size())
    assert shapes[0] == (min(rows, max(0, 7 - hvd.rank() * rows)), 7), shapes  # sharded again: a DTensor whose local rows are this rank's
    model.train()


def adam_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, whole: bool, steps: int = 2) -> None:
    for x, y in list(batches())[:steps]:
        optimizer.zero_grad()
        (loss_of(model, x, y) if whole else loss_of(model, mine(x), mine(y))).backward()
        optimizer.step()


def checkpoint() -> None:
    """Full state dicts, model and optimizer, both ways: sharded -> plain and plain -> sharded, and
    training goes on as the plain model's; a plain state dict loads into a sharded model built on meta."""
    reference = build(seed=5)
    reference_optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)
    adam_steps(reference, reference_optimizer, whole=True)
    model = shard(build(seed=6))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    hvd.load_full_state_dict(model, reference.state_dict())
    hvd.load_full_optimizer_state_dict(model, optimizer, reference_optimizer.state_dict())
    gathered = hvd.full_state_dict(model)
    gathered_optimizer = hvd.full_optimizer_state_dict(model, optimizer)
    if hvd.rank() == 0:
        plain = build(seed=7)
        plain.load_state_dict(gathered)
        plain_optimizer = torch.optim.Adam(plain.parameters(), lr=0.01)
        plain_optimizer.load_state_dict(gathered_optimizer)
        assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), reference.state_dict().values(),
                                                     strict=True))
        for index, state in reference_optimizer.state_dict()["state"].items():
            assert all(torch.equal(plain_optimizer.state_dict()["state"][index][k], v) for k, v in state.items())
    else:
        assert gathered == {} and gathered_optimizer == {}
    adam_steps(reference, reference_optimizer, whole=True)
    adam_steps(model, optimizer, whole=False)
    assert_matches(model, reference, "checkpoint")
    on_meta = shard(build(device="meta"))
    on_meta.to_empty(device="cpu")
    hvd.load_full_state_dict(on_meta, reference.state_dict())
    x = torch.randn(4, 7, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.allclose(on_meta(x), reference(x), atol=1e-6)
    loss_of(on_meta, x, torch.zeros(4, 3)).backward()
    assert all(p.grad is not None for p in on_meta.parameters())


def memory() -> None:
    """Parameters + gradients + Adam state per rank, counted tensor by tensor, within 1.05 x
    (unsharded / N) plus the two largest units."""
    reference = build(width=96, blocks=6)
    unit_bytes = sorted(sum(p.numel() * 4 for p in block.parameters()) for block in list(reference)[:-2])
    unsharded = sum(p.numel() * 4 for p in reference.parameters()) * 4  # param, grad, Adam's two moments
    model = shard(copy.deepcopy(reference))
    del reference
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.randn(BATCH, 96), torch.randn(BATCH, 3)
    loss_of(model, x, y).backward()
    optimizer.step()
    local = lambda t: t.to_local() if isinstance(t, DTensor) else t  # noqa: E731 (this rank's rows)
    held = sum(local(p).numel() * 4 for p in model.parameters()) + sum(local(p.grad).numel() * 4
                                                                      for p in model.parameters())
    held += sum(local(t).numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                if isinstance(t, torch.Tensor) and t.dim() > 0)
    unit = next(m for m in model.modules() if isinstance(m, hvd.FullyShardedModule))._hvdlite_unit
    full_left = sum(p.full.untyped_storage().size() for u in [unit] for p in u.params)
    bound = 1.05 * unsharded / hvd.size() + 2 * unit_bytes[-1]
    assert held <= bound and full_left == 0, (held, bound, full_left)
    print(f"model state {held} bytes per rank, unsharded {unsharded}, bound {bound:.0f}", flush=True)


class Branching(torch.nn.Module):
    """Rank 1 skips block 1: the ranks' forwards take different paths."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(7, 7) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, block in enumerate(self.blocks):
            if not (hvd.rank() == 1 and index == 1):
                x = block(x)
        return x


def diverge() -> None:
    """Ranks whose forwards differ: every rank gets an error naming the unit and the ranks missing."""
    model = Branching()
    for block in model.blocks:
        hvd.fully_shard(block)
    hvd.fully_shard(model)
    try:
        model(torch.ones(2, 7)).sum().backward()
    except hvd.StallError as error:
        print(f"caught {type(error).__name__}: {error}", flush=True)
        return
    raise AssertionError("different forward paths went unnoticed")


def refused(what: str, call, message: str) -> None:
    try:
        call()
    except ValueError as error:
        assert message in str(error), (what, str(error))
        return
    raise AssertionError(f"{what} was accepted")


def refusals() -> None:
    """What fully_shard does not do (yet) is refused by name, as is wrapping its shards twice."""
    refused("a group size that does not divide the ranks", lambda: hvd.fully_shard(
        build(), reshard_after_forward=hvd.size() + 1), "a number of ranks that divides the process set's")
    refused("mp_policy without dtypes", lambda: hvd.fully_shard(build(), mp_policy=object()),
            "mp_policy {'param_dtype': 'missing', 'reduce_dtype': 'missing'}")
    refused("an integer param_dtype", lambda: hvd.fully_shard(build(), mp_policy=hvd.MixedPrecisionPolicy(torch.int8)),
            "must be floating torch dtypes")
    refused("offload to disk", lambda: hvd.fully_shard(build(), offload="disk"), "offload='disk': None, 'cpu'")
    model = shard(build())
    refused("fully_shard twice", lambda: hvd.fully_shard(model), "already fully sharded")
    refused("shard_optimizer_state", lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
        shard_optimizer_state=True), "shard_optimizer_state cannot apply to the parameters of a fully_shard")
    early_model = build()
    early = torch.optim.SGD(early_model.parameters(), lr=0.1)
    shard(early_model)
    refused("an optimizer built before fully_shard", early.step, "is no longer on the model")
    model(torch.ones(1, 7, device=DEVICE))
    late = build()
    late[4].weight = model[0][0].weight  # tied to a unit that has already run
    refused("a tie to a unit that has run", lambda: hvd.fully_shard(late), "which has already run")


def save_sharded() -> None:
    """Train, write a sharded checkpoint (and, from rank 0, the full state it must give back)."""
    model = shard(build(seed=8))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    adam_steps(model, optimizer, whole=False)
    hvd.save_sharded_state(ARGS[0], model, optimizer)
    full = hvd.full_state_dict(model), hvd.full_optimizer_state_dict(model, optimizer)
    if hvd.rank() == 0:
        torch.save(full, f"{ARGS[0]}/expected.pt")
    save_tied(f"{ARGS[0]}/tied")


def load_sharded() -> None:
    """Read save_sharded's checkpoint at this job's size: the same parameters and optimizer state."""
    model = shard(build(seed=9))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    hvd.load_sharded_state(ARGS[0], model, optimizer)
    expected_model, expected_optimizer = torch.load(f"{ARGS[0]}/expected.pt", weights_only=True)
    full = hvd.full_state_dict(model, rank0_only=False)
    assert all(torch.equal(full[k], v) for k, v in expected_model.items()) and list(full) == list(expected_model)
    state = hvd.full_optimizer_state_dict(model, optimizer, rank0_only=False)["state"]
    for index, entry in expected_optimizer["state"].items():
        assert all(torch.equal(state[index][k], v) for k, v in entry.items()), index
    adam_steps(model, optimizer, whole=False, steps=1)  # and it trains on
    load_tied(f"{ARGS[0]}/tied")


CASES = {
    "sgd": lambda: train("sgd"),
    "adam": lambda: train("adam", torch.optim.Adam),
    "offload": lambda: train("offload", torch.optim.Adam, offload="cpu"),
    "keep_after_forward": lambda: train("keep_after_forward", torch.optim.Adam, reshard_after_forward=False),
    "prefetch_off": lambda: train("prefetch_off", torch.optim.Adam),
    "accumulate": lambda: train("accumulate", accumulate=2),
    "accumulate_no_sync": lambda: train("accumulate_no_sync", accumulate=2, no_sync=True),
    "clip": lambda: train("clip", clip=0.05),
    "distributed_optimizer": lambda: train("distributed_optimizer", wrap=True),
    "mixed_precision": lambda: mixed_precision("mixed_precision", torch.float32),
    "mixed_precision_bf16_reduce": lambda: mixed_precision("mixed_precision_bf16_reduce", None),
    "hybrid": hybrid,
    "group_reshard": group_reshard,
    "frozen": frozen,
    "evaluation": evaluation,
    "checkpoint": checkpoint,
    "memory": memory,
    "diverge": diverge,
    "refusals": refusals,
    "save_sharded": save_sharded,
    "load_sharded": load_sharded,
    **WRAPPING_CASES,
}
ARGS: list[str] = []


def main() -> None:
    hvd.init(process_sets="dynamic")  # the hybrid case adds its sets
    ARGS.extend(sys.argv[2:])
    for case in sys.argv[1].split(","):
        CASES[case]()
        print(f"ok {case}", flush=True)


if __name__ == "__main__":
    main()
