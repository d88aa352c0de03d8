"""torch CUDA tensors through hvdlite: every collective and dtype, in place and not, and
DistributedOptimizer equivalence with one process on the full batch. Usage: torch_cuda.py CASE.

Expected values are computed on the host from each rank's known inputs; the "semantics" case
(torch_semantics.py) compares each call with the same call on CPU tensors. Prints "ok CASE" at the end.
"""

import sys

import torch
from torch_semantics import semantics

import hvdlite.torch as hvd

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.int16,
          torch.int8, torch.uint8, torch.bool]


def value(rank, shape, dtype, device):
    base = torch.arange(torch.Size(shape).numel(), dtype=torch.float64).reshape(shape) % 7 + rank + 1
    if dtype is torch.bool:
        return ((base.long() + rank) % 2 == 0).to(device)
    return base.to(dtype).to(device)


def check(name, got, expected, tol=0.0):
    assert got.device.type == "cuda", f"{name}: result on {got.device}"
    assert got.dtype == expected.dtype and got.shape == expected.shape, (name, got.dtype, got.shape, expected.shape)
    if tol:
        torch.testing.assert_close(got.cpu().double(), expected.cpu().double(), rtol=tol, atol=tol, msg=name)
    else:
        assert torch.equal(got.cpu(), expected.cpu()), f"{name}: {got.cpu()} != {expected.cpu()}"


def ops(rank, size, device):
    for dtype in DTYPES:
        tag = str(dtype).removeprefix("torch.")
        tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 0.0
        inputs = [value(r, (3, 5), dtype, "cpu") for r in range(size)]
        mine = inputs[rank].to(device)
        if dtype is torch.bool:
            check(f"sum {tag}", hvd.allreduce(mine, op=hvd.Sum, name=f"sum.{tag}"),
                  torch.stack(inputs).any(0))
            continue
        total = torch.stack([t.double() for t in inputs]).sum(0)
        check(f"sum {tag}", hvd.allreduce(mine, op=hvd.Sum, name=f"sum.{tag}"), total.to(dtype), tol)
        check(f"max {tag}", hvd.allreduce(mine, op=hvd.Max, name=f"max.{tag}"), torch.stack(inputs).max(0).values)
        if dtype.is_floating_point:
            check(f"avg {tag}", hvd.allreduce(mine, name=f"avg.{tag}"), (total / size).to(dtype), tol)
            scaled = hvd.allreduce(mine, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0, name=f"scaled.{tag}")
            check(f"scaled {tag}", scaled, (total * 1.5).to(dtype), tol)
            twice = mine.clone()
            hvd.allreduce_(twice, op=hvd.Sum, name=f"inplace.{tag}")
            check(f"in place {tag}", twice, total.to(dtype), tol)
        grouped = hvd.grouped_allreduce([mine, mine[:1].contiguous()], op=hvd.Sum, name=f"group.{tag}")
        check(f"grouped {tag}", grouped[0], total.to(dtype), tol)
        gathered = hvd.allgather(value(rank, (rank + 1, 2), dtype, device), name=f"gather.{tag}")
        check(f"allgather {tag}", gathered, torch.cat([value(r, (r + 1, 2), dtype, "cpu") for r in range(size)]))
        check(f"broadcast {tag}", hvd.broadcast(mine, root_rank=size - 1, name=f"bcast.{tag}"), inputs[size - 1])
        sent = torch.cat([value(rank * 10 + r, (r + 1, 2), dtype, "cpu") for r in range(size)]).to(device)
        received, splits = hvd.alltoall(sent, splits=[r + 1 for r in range(size)], name=f"a2a.{tag}")
        check(f"alltoall {tag}", received, torch.cat([value(r * 10 + rank, (rank + 1, 2), dtype, "cpu")
                                                      for r in range(size)]))
        assert splits.tolist() == [rank + 1] * size, splits
        if dtype.is_floating_point or dtype in (torch.int32, torch.int64):
            rows = torch.stack([value(r, (2 * size + 1, 2), dtype, "cpu").double() for r in range(size)]).sum(0)
            block = [2 + (1 if r < 1 else 0) for r in range(size)]
            start = sum(block[:rank])
            check(f"reducescatter {tag}", hvd.reducescatter(value(rank, (2 * size + 1, 2), dtype, device),
                                                            op=hvd.Sum, name=f"rs.{tag}"),
                  rows[start:start + block[rank]].to(dtype), tol)
    repeated_in_place(rank, size, device)


def repeated_in_place(rank, size, device):
    """A named blocking allreduce_ called again and again (a metric): from the second call on, the
    small-op path (hvdlite.core.pipeline.lone); interleaved with async work, which turns some calls
    back into pending requests."""
    for step in range(40):
        metric = torch.full((3,), float(rank + step), device=device)
        hvd.allreduce_(metric, op=hvd.Sum, name="metric.sum")
        check(f"repeated sum {step}", metric, torch.full((3,), float(sum(r + step for r in range(size))), device="cpu"))
        mean = torch.full((2,), float(rank + 1), device=device, dtype=torch.float16)
        hvd.allreduce_(mean, name="metric.avg")
        check(f"repeated average {step}", mean, torch.full((2,), (size + 1) / 2, dtype=torch.float16), 1e-3)
        if step % 7 == 3:  # something else pending on this rank meanwhile
            handle = hvd.allreduce_async(torch.ones(5, device=device), op=hvd.Sum, name="pending")
            hvd.allreduce_(metric, op=hvd.Max, name="metric.max")
            check(f"max while pending {step}", hvd.synchronize(handle), torch.full((5,), float(size)))


def adasum(rank, size, device):
    """Adasum on GPU tensors is the Adasum across hosts of each host's average (Horovod's GPU Adasum):
    on this one host, the average of the ranks, on every plane; and the Adasum optimizer with plain
    SGD moves the parameters as the Average optimizer does."""
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        tag = str(dtype).removeprefix("torch.")
        tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
        inputs = [value(r, (3, 5), dtype, "cpu") * (1 + r) for r in range(size)]
        mean = (torch.stack([t.double() for t in inputs]).sum(0) / size).to(dtype)
        check(f"adasum {tag}", hvd.allreduce(inputs[rank].to(device), op=hvd.Adasum, name=f"adasum.{tag}"), mean, tol)
        in_place = inputs[rank].to(device)
        hvd.allreduce_(in_place, op=hvd.Adasum, name=f"adasum_.{tag}")
        check(f"adasum in place {tag}", in_place, mean, tol)
    final = {}
    for op in (hvd.Average, hvd.Adasum):
        torch.manual_seed(0)
        net = torch.nn.Linear(FEATURES, CLASSES).to(device)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), op=op,
                                       named_parameters=net.named_parameters(), backward_passes_per_step=1)
        for step in range(STEPS):
            generator = torch.Generator().manual_seed(100 * step + rank)
            x, y = torch.randn(PER_RANK, FEATURES, generator=generator), torch.randint(CLASSES, (PER_RANK,), generator=generator)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x.to(device)), y.to(device)).backward()
            opt.step()
        final[op] = [p.detach().cpu() for p in net.parameters()]
    for average, combined in zip(final[hvd.Average], final[hvd.Adasum], strict=True):
        torch.testing.assert_close(combined, average, rtol=1e-5, atol=1e-6)


FEATURES, HIDDEN, CLASSES, PER_RANK, STEPS = 6, 16, 3, 4, 5


def model_on(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, CLASSES)).to(device)


def optimizer(rank, size, device):
    reference, distributed = model_on(device), model_on(device)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(distributed.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=distributed.named_parameters())
    hvd.broadcast_parameters(distributed.state_dict(), root_rank=0)
    for step in range(STEPS):
        generator = torch.Generator().manual_seed(step)
        x = torch.randn(PER_RANK * size, FEATURES, generator=generator).to(device)
        y = torch.randint(0, CLASSES, (PER_RANK * size,), generator=generator).to(device)
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        ref_opt.step()
        mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(distributed(x[mine]), y[mine]).backward()
        opt.step()
    for (name, ref), dist in zip(reference.named_parameters(), distributed.parameters(), strict=True):
        assert dist.device.type == "cuda"
        torch.testing.assert_close(dist, ref, rtol=1e-5, atol=1e-6, msg=name)
        gathered = hvd.allgather(dist.detach().unsqueeze(0), name=f"same.{name}")
        assert all(torch.equal(gathered[0], g) for g in gathered), name


def main():
    case = sys.argv[1]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device())
    {"ops": ops, "optimizer": optimizer, "semantics": semantics, "adasum": adasum}[case](rank, size, device)
    print(f"ok {case}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
