"""hvdlite.torch beyond the collectives: gradients of each op, optimizer behaviour, state broadcast.

Usage: torch_api.py CASE. Each check prints "ok <name>"; a failed check raises (and ends the job).
"""

import sys
import warnings

import numpy as np
import torch
from checks import expect_error

import hvdlite.torch as hvd
from hvdlite import api
from hvdlite.gpu.arrays import DeviceArray

torch.set_num_threads(1)


def weights(rank, shape):
    """A per-rank weight for a linear loss; every rank can rebuild every other rank's."""
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float64).reshape(shape) * 0.1 + rank


def close(got, want, what):
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-9), f"{what}: got {got} want {want}"


def case_gradients(rank, size):
    """For loss_r = sum(op(x) * w_r), the gradient each rank gets is known in closed form."""
    every_w = [weights(r, (size + 1, 2)) for r in range(size)]
    w = every_w[rank]

    def grad_of(fn, x):
        x = x.clone().requires_grad_(True)
        (fn(x) * w).sum().backward()
        return x.grad

    x = torch.ones(size + 1, 2, dtype=torch.float64)
    close(grad_of(lambda t: hvd.allreduce(t, op=hvd.Sum), x), sum(every_w), "allreduce Sum")
    close(grad_of(lambda t: hvd.allreduce(t, op=hvd.Average), x), sum(every_w) / size, "allreduce Average")
    close(grad_of(lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5), x),
          sum(every_w), "allreduce scaled")
    close(grad_of(lambda t: hvd.grouped_allreduce([t, t * 2], op=hvd.Sum)[1], x), 2 * sum(every_w), "grouped")
    close(grad_of(lambda t: hvd.broadcast(t, root_rank=size - 1), x),
          sum(every_w) / size if rank == size - 1 else torch.zeros_like(x), "broadcast")
    # allgather: rank r contributes rows [r, r+1]; Horovod's gradient is its slice of the *averaged*
    # weights (allreduce(average=True) in its backward; the mathematical gradient is the sum).
    gathered_w = [weights(r, (2 * size, 2)) for r in range(size)]
    w = gathered_w[rank]
    close(grad_of(lambda t: hvd.allgather(t), torch.ones(2, 2, dtype=torch.float64)),
          sum(gathered_w)[2 * rank: 2 * rank + 2] / size, "allgather")
    close(grad_of(lambda t: hvd.grouped_allgather([t])[0], torch.ones(2, 2, dtype=torch.float64)),
          sum(gathered_w)[2 * rank: 2 * rank + 2] / size, "grouped allgather")
    # reducescatter: every rank's input gets the concatenation of every rank's weights, times size for
    # Sum and as is for Average (Horovod's rule; size times the mathematical gradient for both).
    rs_w = [weights(r, (1, 2)) for r in range(size)]
    w = rs_w[rank]
    block = torch.ones(size, 2, dtype=torch.float64)
    close(grad_of(lambda t: hvd.reducescatter(t, op=hvd.Sum), block), torch.cat(rs_w) * size, "reducescatter Sum")
    close(grad_of(lambda t: hvd.reducescatter(t, op=hvd.Average), block), torch.cat(rs_w), "reducescatter Average")
    close(grad_of(lambda t: hvd.grouped_reducescatter([t, 2 * t], op=hvd.Sum)[1], block), torch.cat(rs_w) * 2 * size,
          "grouped reducescatter")
    # alltoall: the row sent to rank d comes back with rank d's weight for the row it received from us.
    a2a_w = [weights(r, (size, 2)) for r in range(size)]
    w = a2a_w[rank]
    want = torch.stack([a2a_w[d][rank] for d in range(size)])
    close(grad_of(lambda t: hvd.alltoall(t), torch.ones(size, 2, dtype=torch.float64)), want, "alltoall")
    print("ok gradients", flush=True)


def small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def case_optimizer(rank, size):
    model = small_model()
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    assert opt is base and isinstance(opt, torch.optim.SGD) and type(opt) is torch.optim.SGD
    names = list(model.named_parameters())
    expect_error(ValueError, "already a DistributedOptimizer", lambda: hvd.DistributedOptimizer(opt), "twice")
    other = small_model()
    expect_error(ValueError, "Found duplicates: ['0.weight']",
                 lambda: hvd.DistributedOptimizer(torch.optim.SGD(other.parameters(), lr=1),
                                                  named_parameters=[("0.weight", p) for _, p in names]), "duplicate")
    expect_error(ValueError, "were not named",
                 lambda: hvd.DistributedOptimizer(torch.optim.SGD(other.parameters(), lr=1),
                                                  named_parameters=list(other.named_parameters())[:1]), "missing")
    expect_error(ValueError, "sequence of tuples",
                 lambda: hvd.DistributedOptimizer(torch.optim.SGD(other.parameters(), lr=1),
                                                  named_parameters=[p for p in other.parameters()]), "not tuples")
    # Hooks start every allreduce during backward; zero_grad before step is the race Horovod forbids.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    model(torch.randn(5, 3)).sum().backward()
    assert opt._hvdlite_reducer._submitter.in_flight and len(opt._hvdlite_reducer._submitter._finishers) == 4
    expect_error(AssertionError, "zero_grad() was called after loss.backward()", opt.zero_grad, "zero_grad race")
    opt.step()
    opt.zero_grad()
    # A parameter this rank's graph skips is reduced as zeros: no deadlock, the others' gradient / size.
    x = torch.ones(2, 3)
    out = model[0](x).sum() if rank == 0 else model(x).sum()
    out.backward()
    opt.synchronize()
    last = model[2].bias.grad
    assert last is not None and torch.allclose(last, torch.full((2,), 2.0 * (size - 1) / size)), last
    with opt.skip_synchronize():
        opt.step()
    # step() after synchronize() without skip_synchronize warns, as Horovod does, and does not reduce twice.
    opt.zero_grad()
    model(x).sum().backward()
    opt.synchronize()
    before = [p.grad.clone() for p in model.parameters()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    assert any("skip_synchronize" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert all(torch.equal(b, p.grad) for b, p in zip(before, model.parameters(), strict=True))
    # state_dict round-trips into a plain optimizer of the same class.
    plain = torch.optim.SGD(small_model().parameters(), lr=0.5)
    plain.load_state_dict(opt.state_dict())
    assert plain.param_groups[0]["lr"] == 0.1
    print("ok optimizer", flush=True)


def case_grad_scaler(rank, size):
    """Clipping and GradScaler through synchronize() + skip_synchronize(), against a plain reference."""
    results = []
    for distributed in (True, False):
        model = small_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        if distributed:
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        for step in range(3):
            gen = torch.Generator().manual_seed(step)
            x = torch.randn(2 * size, 3, generator=gen)
            part = x[2 * rank: 2 * rank + 2] if distributed else x
            opt.zero_grad()
            scaler.scale(model(part).pow(2).mean()).backward()
            if distributed:
                opt.synchronize()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            if distributed:
                with opt.skip_synchronize():
                    scaler.step(opt)
            else:
                scaler.step(opt)
            scaler.update()
        results.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    diff = (results[0] - results[1]).abs().max().item()
    assert diff < 1e-6, f"GradScaler + clipping: distributed differs from single process by {diff}"
    print("ok grad_scaler", flush=True)


def case_state(rank, size):
    model = small_model()
    if rank != 0:
        for p in model.parameters():
            p.data.fill_(rank)
    model.register_buffer("steps", torch.tensor(rank * 7))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), small_model().parameters(), strict=True))
    assert int(model.steps) == 0
    tied = small_model()
    for p in tied.parameters():
        p.data.fill_(float(rank))
    hvd.broadcast_parameters(tied.named_parameters(), root_rank=size - 1)
    assert all(bool((p == size - 1).all()) for p in tied.parameters())
    # Only the root has Adam state (created lazily by a step) and a different learning rate.
    opt = torch.optim.Adam(model.parameters(), lr=0.01 if rank == 0 else 0.5, betas=(0.8, 0.9))
    if rank == 0:
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == 0.01 and opt.param_groups[0]["betas"] == (0.8, 0.9)
    state = opt.state_dict()["state"]
    assert len(state) == 4 and float(state[0]["step"]) == 1.0
    sums = hvd.allgather_object([float(s["exp_avg_sq"].sum()) for s in state.values()])
    assert all(s == sums[0] for s in sums), sums
    # Parameters without a gradient (unused in forward, or frozen): what exists is broadcast, as in Horovod.
    for make in (lambda ps: torch.optim.SGD(ps, lr=0.1 * (rank + 1), momentum=0.9),
                 lambda ps: torch.optim.Adam(ps, lr=0.1 * (rank + 1))):
        partly = torch.nn.ModuleDict({"used": torch.nn.Linear(3, 1), "unused": torch.nn.Linear(3, 1),
                                      "frozen": torch.nn.Linear(3, 1)})
        partly["frozen"].requires_grad_(False)
        wrapped = hvd.DistributedOptimizer(make(partly.parameters()), named_parameters=partly.named_parameters())
        hvd.broadcast_optimizer_state(wrapped, root_rank=0)  # before any step: no state anywhere yet
        wrapped.zero_grad()
        partly["used"](torch.ones(2, 3)).sum().backward()
        wrapped.step()
        hvd.broadcast_optimizer_state(wrapped, root_rank=0)
        assert wrapped.param_groups[0]["lr"] == 0.1, wrapped.param_groups[0]["lr"]
    # Horovod's optimizer attribute, with and without named_parameters.
    plain = hvd.DistributedOptimizer(torch.optim.SGD(small_model().parameters(), lr=0.1))
    assert sorted(plain._parameter_names.values()) == [f"noname.{i}" for i in range(4)], plain._parameter_names
    named_model = small_model()
    named = hvd.DistributedOptimizer(torch.optim.SGD(named_model.parameters(), lr=0.1),
                                     named_parameters=named_model.named_parameters())
    assert named._parameter_names == {p: n for n, p in named_model.named_parameters()}, named._parameter_names
    print("ok state", flush=True)


def case_sparse(rank, size):
    results = []
    for mode in ("allgather", "dense", "reference"):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 3, sparse=True)
        opt = torch.optim.SGD(emb.parameters(), lr=0.5)
        if mode != "reference":
            opt = hvd.DistributedOptimizer(opt, named_parameters=emb.named_parameters(),
                                           sparse_as_dense=mode == "dense")
        for step in range(3):
            ids = torch.tensor([[(step + r) % 10, (2 * r + 1) % 10] for r in range(size)])
            opt.zero_grad()
            mine = ids[rank: rank + 1] if mode != "reference" else ids
            emb(mine).pow(2).sum().div(mine.shape[0]).backward()
            opt.step()
        results.append(emb.weight.detach().clone())
    for mode, got in zip(("allgather", "dense"), results, strict=False):
        diff = (got - results[2]).abs().max().item()
        assert diff < 1e-6, f"sparse gradients ({mode}) differ from single process by {diff}"
    # Horovod's sparse_allreduce(_async): every rank's entries, averaged (or summed); the handle is also callable.
    sparse = torch.sparse_coo_tensor(torch.tensor([[rank % 4, 3]]), torch.tensor([1.0 + rank, 10.0]), (5,))
    expected = torch.zeros(5)
    for r in range(size):
        expected[r % 4] += 1.0 + r
    expected[3] += 10.0 * size
    summed = hvd.sparse_allreduce(sparse, name="sp.sum", op=hvd.Sum)
    assert summed.is_sparse and torch.allclose(summed.to_dense(), expected), summed
    handle = hvd.sparse_allreduce_async(sparse, name="sp.avg")
    averaged = handle()
    assert torch.allclose(averaged.to_dense(), expected / size) and hvd.poll(handle)
    assert torch.allclose(hvd.synchronize(hvd.sparse_allreduce_async(sparse)).to_dense(), expected / size)
    expect_error(hvd.UnsupportedOperationError, "takes a sparse COO tensor",
                 lambda: hvd.sparse_allreduce(torch.ones(2), name="sp.dense"), "dense input")
    # Gathered rows can only be summed: Max is refused on every rank, before anything is sent.
    emb = torch.nn.Embedding(10, 3, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5), named_parameters=emb.named_parameters(),
                                   op=hvd.Max)
    expect_error(hvd.UnsupportedOperationError, "'grad.weight' supports Sum and Average, not MAX",
                 lambda: emb(torch.tensor([rank])).sum().backward(), "sparse Max")
    print("ok sparse", flush=True)


def mixed_groups(rank, size):
    """A group mixing host and device tensors fails on every rank, also on a rank whose own group is
    uniform (it must not wait forever). The device array is never read: negotiation refuses the group."""
    host = np.ones(2, np.float32)
    device = DeviceArray(0x1000, (2,), np.float32, 0, owner=None)
    for name, mixing in (("mixed.all", range(size)), ("mixed.first", [0])):
        group = [host, device if rank in mixing else host.copy()]
        expect_error(hvd.TensorMismatchError, f"'{name}.0' on cpu, '{name}.1' on cuda; a group's tensors must share "
                     "one device", lambda group=group, name=name: api.grouped_allreduce(group, name=name), name)


def not_tensors(array):
    """NumPy arrays, lists and numbers belong to hvdlite's own collectives: each of the torch adapter's
    says what it got (the named allreduce takes a path of its own for small tensors)."""
    calls = {"allreduce": lambda: hvd.allreduce(array), "named allreduce": lambda: hvd.allreduce(array, name="w"),
             "allreduce_": lambda: hvd.allreduce_(array), "allreduce_async": lambda: hvd.allreduce_async(array),
             "allgather": lambda: hvd.allgather([1.0]), "grouped_allgather": lambda: hvd.grouped_allgather([array]),
             "broadcast": lambda: hvd.broadcast(3.0, 0), "alltoall": lambda: hvd.alltoall(array),
             "grouped_allreduce": lambda: hvd.grouped_allreduce([array]), "reducescatter": lambda: hvd.reducescatter(array)}
    for what, call in calls.items():
        expect_error(TypeError, "must be a torch.Tensor, got ", call, f"{what} of no tensor")


def case_errors(rank, size):
    expect_error(hvd.UnsupportedOperationError, "complex64", lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64),
                                                                                 name="cplx"), "dtype")
    expect_error(hvd.UnsupportedOperationError, "Adasum needs a floating-point",
                 lambda: hvd.allreduce(torch.ones(2, dtype=torch.int32), op=hvd.Adasum), "adasum int")
    expect_error(ValueError, "op=Adasum) cannot be combined with compression",
                 lambda: hvd.DistributedOptimizer(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1),
                                                  op=hvd.Adasum, compression=hvd.Compression.fp16), "adasum optimizer")
    assert hvd.allreduce(torch.ones(2), op=hvd.Adasum, name="adasum.same").tolist() == [1.0, 1.0]
    expect_error(hvd.ProcessSetError, "is not registered",
                 lambda: hvd.allreduce(torch.ones(2), process_set=hvd.ProcessSet([0])), "process set")
    # Shapes that disagree across ranks: every rank gets an error naming the tensor and the shapes.
    expect_error(hvd.TensorMismatchError, "'bad.shape'",
                 lambda: hvd.allreduce(torch.ones(rank + 1), name="bad.shape"), "mismatch")
    mixed_groups(rank, size)
    not_tensors(np.ones(2))
    # Non-contiguous and in-place forms still work after an error.
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()
    hvd.allreduce_(t, op=hvd.Sum)
    assert torch.equal(t, torch.arange(6, dtype=torch.float32).reshape(2, 3).t() * size), t
    print("ok errors", flush=True)


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    cases = {"gradients": case_gradients, "optimizer": case_optimizer, "grad_scaler": case_grad_scaler,
             "state": case_state, "sparse": case_sparse, "errors": case_errors}
    for case in sys.argv[1].split(","):  # one job for several cases: each prints "ok <case>"
        cases[case](rank, size)
    hvd.shutdown()


if __name__ == "__main__":
    main()
