"""PyTorch with two data-parallel process sets (even and odd ranks), as a Horovod script would have them.

Each set trains its own copy of a model on its own data with ``DistributedOptimizer(process_set=...)``;
every rank checks its parameters against one process training on the whole of its set's batch, and
the differentiable collectives' gradients on a set. Prints 'ok torch process sets'.
"""

import torch
from mpi4py import MPI

import hvdlite.torch as hvd

STEPS, BATCH = 3, 4


def batch(set_index: int, member: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * set_index + 10 * member + step)
    return torch.randn(BATCH, 5, generator=generator), torch.randn(BATCH, 1, generator=generator)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))


def check_collective_gradients(mine: hvd.ProcessSet, rank: int) -> None:
    members, n = mine.ranks, mine.size()
    x = torch.full((2,), float(rank + 1), requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum, name="ar", process_set=mine)
    assert y.tolist() == [sum(r + 1.0 for r in members)] * 2, y
    y.sum().backward()
    assert x.grad.tolist() == [float(n)] * 2, x.grad
    rows = torch.ones(rank + 1, 2, requires_grad=True)  # members gather different row counts
    gathered = hvd.allgather(rows, name="ag", process_set=mine)
    assert gathered.shape == (sum(r + 1 for r in members), 2), gathered.shape
    gathered.sum().backward()
    # this member's rows (found by its rank in the set) of the output's gradient averaged over the set
    assert rows.grad.shape == rows.shape and torch.all(rows.grad == 1.0), rows.grad
    block = torch.ones(2 * n, 1, requires_grad=True)
    mine_rows = hvd.reducescatter(block, op=hvd.Average, name="rs", process_set=mine)
    assert mine_rows.shape == (2, 1)
    mine_rows.sum().backward()
    assert torch.allclose(block.grad, torch.ones(2 * n, 1)), block.grad  # Horovod's rule: gathered, as is for Average
    root = members[-1]
    w = torch.full((3,), float(rank), requires_grad=True)
    b = hvd.broadcast(w, root_rank=root, name="bc", process_set=mine)
    assert b.tolist() == [float(root)] * 3
    b.sum().backward()
    assert w.grad.tolist() == ([1.0] * 3 if rank == root else [0.0] * 3), w.grad


def check_training(mine: hvd.ProcessSet, set_index: int) -> None:
    net = model()
    with torch.no_grad():  # different starting points on every rank: the broadcast must fix them
        for p in net.parameters():
            p.add_(MPI.COMM_WORLD.Get_rank())
    hvd.broadcast_parameters(net.state_dict(), root_rank=mine.ranks[0], process_set=mine)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=net.named_parameters(), process_set=mine)
    hvd.broadcast_optimizer_state(opt, root_rank=mine.ranks[0], process_set=mine)
    reference = model()
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(mine.ranks[0])
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        x, y = batch(set_index, mine.rank(), step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        whole = [batch(set_index, member, step) for member in range(mine.size())]
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(torch.cat([b[0] for b in whole])),
                                     torch.cat([b[1] for b in whole])).backward()
        ref_opt.step()
    for got, want in zip(net.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(got, want, atol=1e-5), (got, want)


def main() -> None:
    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    sets = [hvd.ProcessSet([r for r in range(size) if r % 2 == parity]) for parity in (0, 1)]
    pair = hvd.ProcessSet([0, 1])  # overlaps both data-parallel sets
    hvd.init(process_sets=[*sets, pair])
    mine, other = sets[rank % 2], sets[1 - rank % 2]
    check_collective_gradients(mine, rank)
    if pair.included():
        check_collective_gradients(pair, rank)
    check_training(mine, rank % 2)
    try:
        hvd.allreduce(torch.ones(1), name="other", process_set=other)
        raise AssertionError("a collective on a set this rank is not in must fail")
    except hvd.ProcessSetError as exc:
        assert f"rank {rank} is not in process set {other.process_set_id}" in str(exc), exc
    # As in Horovod, an optimizer for a set this rank is not in stays local: it steps without any collective.
    local = torch.nn.Linear(2, 1)
    before = local.weight.detach().clone()
    outsider = hvd.DistributedOptimizer(torch.optim.SGD(local.parameters(), lr=1.0), process_set=other)
    local(torch.ones(1, 2)).sum().backward()
    outsider.step()
    assert torch.allclose(local.weight, before - 1.0)
    hvd.barrier(process_set=mine)
    assert hvd.allgather_object(mine.process_set_id) == [1 + r % 2 for r in range(size)]  # the global set still works
    hvd.shutdown()
    print("ok torch process sets", flush=True)


if __name__ == "__main__":
    main()
