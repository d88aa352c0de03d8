"""Where hvdlite.torch once differed from horovod.torch in its signatures and return values: each
case is one such place, written as a Horovod script writes it. Prints "ok <case>" for each."""

import torch

import hvdlite.torch as hvd


def case_grouped_async_handles(rank, size):
    """Horovod's grouped _async functions return one handle: synchronize gives the list, poll waits
    for all. hvdlite's is also the list of member handles."""
    tensors = [torch.full((2,), float(rank)), torch.full((3,), 1.0)]
    group = hvd.grouped_allreduce_async(tensors, op=hvd.Sum)
    total = sum(range(size))
    results = hvd.synchronize(group)
    assert [t.tolist() for t in results] == [[float(total)] * 2, [float(size)] * 3], results
    assert hvd.poll(group) and len(group) == 2 and hvd.synchronize(group[1]).tolist() == [float(size)] * 3
    in_place = hvd.grouped_allreduce_async_(tensors, op=hvd.Sum)
    assert hvd.synchronize(in_place)[0] is tensors[0] and tensors[0].tolist() == [float(total)] * 2
    gathered = hvd.synchronize(hvd.grouped_allgather_async([torch.tensor([rank]), torch.tensor([[rank]])]))
    assert gathered[0].tolist() == list(range(size)) and gathered[1].shape == (size, 1), gathered
    blocks = hvd.synchronize(hvd.grouped_reducescatter_async([torch.ones(size, 2)], "grs", hvd.Sum))
    assert blocks[0].tolist() == [[float(size)] * 2], blocks
    print("ok grouped_async_handles", flush=True)


def case_reducescatter_signature(rank, size):
    """Horovod's order: reducescatter(tensor, name, compression, op, process_set, prescale, postscale)."""
    rows = torch.ones(2 * size, 2)
    assert hvd.reducescatter(rows, "rs.positional").tolist() == [[1.0, 1.0]] * 2  # Average by default
    summed = hvd.reducescatter(rows, "rs.fp16", hvd.Compression.fp16, hvd.Sum)
    assert summed.dtype == torch.float32 and summed.tolist() == [[float(size)] * 2] * 2, summed
    handle = hvd.reducescatter_async(rows, "rs.async", hvd.Sum, hvd.global_process_set, 2.0)
    assert hvd.synchronize(handle).tolist() == [[2.0 * size] * 2] * 2
    grouped = hvd.grouped_reducescatter([rows, 2 * rows], "grs.positional", hvd.Compression.none, hvd.Sum)
    assert [g.tolist() for g in grouped] == [[[float(size)] * 2] * 2, [[2.0 * size] * 2] * 2], grouped
    print("ok reducescatter_signature", flush=True)


def case_broadcast_parameters_list(rank, size):
    """Horovod accepts ``broadcast_parameters(list(model.parameters()), root_rank)``."""
    torch.manual_seed(rank)
    model = torch.nn.Linear(3, 2)
    hvd.broadcast_parameters(list(model.parameters()), root_rank=size - 1)
    torch.manual_seed(size - 1)
    root = torch.nn.Linear(3, 2)
    for got, want in zip(model.parameters(), root.parameters(), strict=True):
        assert torch.equal(got, want), (got, want)
    print("ok broadcast_parameters_list", flush=True)


def case_two_optimizers_with_groups(rank, size):
    """Two wrapped optimizers, each with groups=, step in the same iteration (a GAN's generator and
    discriminator): their groups' names must not collide."""
    first, second = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    opts = [hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(
        prefix=prefix), groups=1) for m, prefix in ((first, "g"), (second, "d"))]
    x = torch.full((1, 2), float(rank))
    (first(x).sum() + second(x).sum()).backward()
    for opt in opts:
        opt.step()
    mean = sum(range(size)) / size
    for model in (first, second):
        assert torch.allclose(model.weight.grad, torch.full((1, 2), mean)), model.weight.grad
    print("ok two_optimizers_with_groups", flush=True)


def main():
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    for case in (case_grouped_async_handles, case_reducescatter_signature, case_broadcast_parameters_list,
                 case_two_optimizers_with_groups):
        case(rank, size)
    hvd.shutdown()


if __name__ == "__main__":
    main()
