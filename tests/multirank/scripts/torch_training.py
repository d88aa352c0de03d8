"""DistributedOptimizer trains like one process on the concatenated batch. Usage: CASE [ARGS].

Every rank builds the whole dataset, trains a reference model on the full batch locally (no
communication), and trains the distributed model on its own shard; the two must agree, and the
distributed parameters must be identical on every rank.
"""

import sys

import torch

import hvdlite.torch as hvd

torch.set_num_threads(1)
FEATURES, HIDDEN, CLASSES, PER_RANK, STEPS = 6, 16, 3, 4, 5


def make_model(compiled=False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, CLASSES))
    return model


def make_optimizer(kind, params, lr_scale=1.0):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1 * lr_scale, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01 * lr_scale)


def batch(step, micro, size):
    generator = torch.Generator().manual_seed(1000 * step + micro)
    x = torch.randn(PER_RANK * size, FEATURES, generator=generator)
    y = torch.randint(0, CLASSES, (PER_RANK * size,), generator=generator)
    return x, y


def loss_fn(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def reference(kind, passes, size):
    model = make_model()
    opt = make_optimizer(kind, model.parameters())
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(passes):
            loss_fn(model, *batch(step, micro, size)).backward()
        opt.step()
    return model


def distributed(kind, passes, compression, groups=None, compiled=False):
    rank, size = hvd.rank(), hvd.size()
    model = make_model()
    if rank != 0:  # start from different weights: broadcast_parameters must fix that
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    opt = make_optimizer(kind, model.parameters())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=compression,
                                   backward_passes_per_step=passes, groups=groups)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    forward = torch.compile(model, backend="aot_eager") if compiled else model
    shard = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(passes):
            x, y = batch(step, micro, size)
            # Each rank's mean loss over its shard; averaging gradients gives the full-batch mean.
            loss_fn(forward, x[shard], y[shard]).backward()
        opt.step()
    return model


def compare(got, want, tol, what):
    flat_got = torch.cat([p.detach().reshape(-1) for p in got.parameters()])
    flat_want = torch.cat([p.detach().reshape(-1) for p in want.parameters()])
    diff = (flat_got - flat_want).abs().max().item()
    assert diff <= tol, f"{what}: max |distributed - single process| = {diff} > {tol}"
    everyone = hvd.allgather(flat_got.unsqueeze(0))
    spread = (everyone - everyone[0]).abs().max().item()
    assert spread == 0.0, f"{what}: parameters differ across ranks by {spread}"
    print(f"ok {what} max diff {diff:.2e}", flush=True)


def case_equivalence(kind, passes, compression_name, groups=None, compiled=False):
    compression = getattr(hvd.Compression, compression_name)
    tol = 1e-5 if compression_name == "none" else 5e-2 if compression_name == "bf16" else 5e-3
    got = distributed(kind, int(passes), compression, groups, compiled)
    want = reference(kind, int(passes), hvd.size())
    compare(got, want, tol, f"{kind} passes={passes} compression={compression_name} groups={groups} "
                            f"compiled={compiled}")


def case_buckets():
    """Run with HVDLITE_BUCKET_BYTES small: several buckets, of two dtypes; a gradient a hook
    replaced by a non-contiguous tensor in a later step is still reduced, and written back."""
    rank, size = hvd.rank(), hvd.size()

    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(),
                                   torch.nn.Linear(HIDDEN, HIDDEN).double(), torch.nn.Tanh(),
                                   torch.nn.Linear(HIDDEN, CLASSES))

    def forward(model, x):
        return model[4](model[3](model[2](model[1](model[0](x)).double())).float())

    transposing = [False]

    def transpose(weight):  # registered before hvdlite's hook, so it runs first
        if transposing[0]:
            weight.grad = weight.grad.t().contiguous().t()
            assert not weight.grad.is_contiguous()

    def train(model, opt, shard, transpose_at):
        for step in range(STEPS):
            opt.zero_grad()
            x, y = batch(step, 0, size)
            transposing[0] = step == transpose_at
            torch.nn.functional.cross_entropy(forward(model, x[shard]), y[shard]).backward()
            opt.step()

    model = build()
    model[2].weight.register_post_accumulate_grad_hook(transpose)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    train(model, opt, slice(rank * PER_RANK, (rank + 1) * PER_RANK), transpose_at=3)
    buckets = opt._hvdlite_reducer._submitter._buckets
    names = [[n for n, p in model.named_parameters() if any(p is q for q in b.params)] for b in buckets]
    assert len(buckets) >= 3 and sorted(sum(names, [])) == sorted(n for n, _ in model.named_parameters()), names
    assert all(len({p.dtype for p in b.params}) == 1 for b in buckets), names
    want = build()
    train(want, torch.optim.SGD(want.parameters(), lr=0.1, momentum=0.9), slice(None), transpose_at=-1)
    compare(model, want, 1e-5, f"buckets {names}")


def main():
    hvd.init()
    case, *args = sys.argv[1:]
    if case == "equivalence":
        for kind in ("sgd", "adam"):
            for passes in (1, 2):
                case_equivalence(kind, passes, "none")
        case_equivalence("sgd", 1, "fp16")
        case_equivalence("adam", 2, "bf16")
        case_equivalence("sgd", 1, "none", groups=2)
        case_equivalence("adam", 1, "none", compiled=True)
    elif case == "buckets":
        case_buckets()
    else:
        raise SystemExit(f"unknown case {case}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
