"""The "semantics" case of torch_cuda.py: every collective on CUDA tensors equals the same call on the CPU.

Each check runs one call twice, on CUDA copies of its inputs and on CPU copies (names ending in
".cuda" and ".cpu"), and compares: exactly for integers and bool, within a few roundings for floats
(NCCL reduces 16-bit floats in their own type, the host in float32). Covered: allreduce (every dtype
and op, unscaled and pre/post-scaled, integers included), its async, in-place and grouped forms,
allgather, broadcast, alltoall (received splits on the splits' device), reducescatter, join,
SyncBatchNorm against BatchNorm2d on the whole batch, and a grouped allreduce that mixes devices.

``python torch_semantics.py`` runs the same calls with "cpu" in place of "cuda" (a dry run of the
calls themselves, on a machine without a GPU).
"""

import sys

import torch

import hvdlite.torch as hvd

DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
          torch.float64, torch.bool]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]
TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float32: 1e-5, torch.float64: 1e-12}
# (prescale, postscale): fractions whose products truncate, so integer rounding is checked too
SCALES = [(1.0, 1.0), (0.5, 3.0), (2.5, 1 / 3)]


def value(rank, shape, dtype, seed=0):
    """Small values every dtype holds exactly (uint8 non-negative; products of 3 ranks stay in int8)."""
    base = (torch.arange(torch.Size(shape).numel()).reshape(shape) * 3 + seed) % 4 + rank
    if dtype is torch.bool:
        return base % 2 == 0
    if dtype is torch.uint8:
        return base.to(dtype)
    if dtype.is_floating_point:
        return ((base - 2) * 0.5).to(dtype)
    return (base - 2).to(dtype)


def compare(what, got, want, device):
    if isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), (what, got)
        for index, (g, w) in enumerate(zip(got, want, strict=True)):
            compare(f"{what}[{index}]", g, w, device)
        return
    assert got.device.type == device.type, f"{what}: result on {got.device}, expected {device.type}"
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape, want.dtype, want.shape)
    got = got.cpu()
    if want.dtype.is_floating_point:
        tol = TOL[want.dtype]
        torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol, msg=what)
    else:
        assert torch.equal(got, want), f"{what}: {got} != {want} (CPU)"


def same(what, fn, inputs, device):
    """``fn(tensors, name)`` on ``device`` copies of ``inputs``, then on CPU copies: equal results."""
    got = fn([t.to(device, copy=True) for t in inputs], f"{what}.{device.type}")
    want = fn([t.clone() for t in inputs], f"{what}.cpu")
    compare(what, got, want, device)


def scales_for(dtype, op):
    if dtype is torch.bool:
        return [(1.0, 1.0)]
    return SCALES[:2] if op is hvd.Product else SCALES  # (2.5, 1/3) would overflow int8 products


def ops_for(dtype):
    return [op for op in OPS if not (dtype is torch.bool and op is hvd.Average)]


def allreduce_ops(rank, size, device):
    """Every dtype, op and scaling of a blocking allreduce."""
    for dtype in DTYPES:
        tag = str(dtype).removeprefix("torch.")
        for op in ops_for(dtype):
            for pre, post in scales_for(dtype, op):
                same(f"allreduce.{tag}.{op.name}.{pre:g}.{post:.3g}",
                     lambda ts, name, op=op, pre=pre, post=post: hvd.allreduce(
                         ts[0], name=name, op=op, prescale_factor=pre, postscale_factor=post),
                     [value(rank, (3, 5), dtype)], device)


def _allreduce_forms(op, pre, post):
    """The async, in-place and grouped forms of one allreduce, each as fn(tensors, name)."""
    kw = {"op": op, "prescale_factor": pre, "postscale_factor": post}
    return {
        "async": lambda ts, name: hvd.synchronize(hvd.allreduce_async(ts[0], name=name, **kw)),
        "in_place": lambda ts, name: (hvd.allreduce_(ts[0], name=name, **kw), ts[0])[1],
        "async_in_place": lambda ts, name: (hvd.synchronize(hvd.allreduce_async_(ts[0], name=name, **kw)), ts[0])[1],
        "grouped": lambda ts, name: hvd.grouped_allreduce(ts, name=name, **kw),
        "grouped_async": lambda ts, name: hvd.synchronize(hvd.grouped_allreduce_async(ts, name=name, **kw)),
        "grouped_in_place": lambda ts, name: (hvd.grouped_allreduce_(ts, name=name, **kw), ts)[1],
        "grouped_async_in_place": lambda ts, name: (hvd.synchronize(hvd.grouped_allreduce_async_(ts, name=name, **kw)),
                                                    ts)[1],
    }


def allreduce_forms(rank, size, device):
    for dtype in DTYPES:
        tag = str(dtype).removeprefix("torch.")
        for op in (hvd.Sum, hvd.Average) if dtype is not torch.bool else (hvd.Sum,):
            pre, post = scales_for(dtype, op)[-1]
            for form, fn in _allreduce_forms(op, pre, post).items():
                inputs = [value(rank, (3, 5), dtype), value(rank, (4,), dtype, seed=1)]
                same(f"{form}.{tag}.{op.name}", fn, inputs[:1] if "grouped" not in form else inputs, device)


def gather_and_broadcast(rank, size, device):
    root = size - 1
    for dtype in DTYPES:
        tag = str(dtype).removeprefix("torch.")
        mine = [value(rank, (rank + 1, 2), dtype), value(rank, (2 * rank + 1, 3), dtype, seed=2)]
        same(f"allgather.{tag}", lambda ts, name: hvd.allgather(ts[0], name=name), mine[:1], device)
        same(f"allgather_async.{tag}", lambda ts, name: hvd.synchronize(hvd.allgather_async(ts[0], name=name)),
             mine[:1], device)
        same(f"grouped_allgather.{tag}", lambda ts, name: hvd.grouped_allgather(ts, name=name), mine, device)
        same(f"grouped_allgather_async.{tag}",
             lambda ts, name: hvd.synchronize(hvd.grouped_allgather_async(ts, name=name)), mine, device)
        forms = {
            "broadcast": lambda ts, name: hvd.broadcast(ts[0], root, name=name),
            "broadcast_async": lambda ts, name: hvd.synchronize(hvd.broadcast_async(ts[0], root, name=name)),
            "broadcast_": lambda ts, name: (hvd.broadcast_(ts[0], root, name=name), ts[0])[1],
            "broadcast_async_": lambda ts, name: (hvd.synchronize(hvd.broadcast_async_(ts[0], root, name=name)),
                                                  ts[0])[1],
        }
        for form, fn in forms.items():
            same(f"{form}.{tag}", fn, [value(rank, (3, 4), dtype)], device)


def alltoall(rank, size, device):
    counts = [r + 1 for r in range(size)]
    for dtype in DTYPES:
        tag = str(dtype).removeprefix("torch.")
        sent = [torch.cat([value(rank * 10 + r, (r + 1, 2), dtype) for r in range(size)])]
        same(f"alltoall.{tag}", lambda ts, name: hvd.alltoall(ts[0], counts, name=name)[0], sent, device)
        same(f"alltoall_async.{tag}", lambda ts, name: hvd.synchronize(hvd.alltoall_async(ts[0], counts, name=name))[0],
             sent, device)
        even = [value(rank, (2 * size, 3), dtype)]
        same(f"alltoall_even.{tag}", lambda ts, name: hvd.alltoall(ts[0], name=name), even, device)
    # Horovod's received splits: on the splits tensor's device, on the CPU for a list
    data, received = hvd.alltoall(sent[0].to(device), torch.tensor(counts, device=device), name="splits.tensor")
    assert received.device.type == device.type and received.dtype == torch.int32, received
    assert received.tolist() == [rank + 1] * size, received
    data, received = hvd.alltoall(sent[0].to(device), counts, name="splits.list")
    assert received.device.type == "cpu" and data.device.type == device.type, (received, data.device)


def reducescatter(rank, size, device):
    for dtype in DTYPES:
        tag = str(dtype).removeprefix("torch.")
        for op in (hvd.Sum, hvd.Average) if dtype is not torch.bool else (hvd.Sum,):
            for pre, post in scales_for(dtype, op):
                kw = {"op": op, "prescale_factor": pre, "postscale_factor": post}
                forms = {
                    "reducescatter": lambda ts, name, kw=kw: hvd.reducescatter(ts[0], name=name, **kw),
                    "reducescatter_async": lambda ts, name, kw=kw: hvd.synchronize(
                        hvd.reducescatter_async(ts[0], name=name, **kw)),
                    "grouped_reducescatter": lambda ts, name, kw=kw: hvd.grouped_reducescatter(ts, name=name, **kw),
                    "grouped_reducescatter_async": lambda ts, name, kw=kw: hvd.synchronize(
                        hvd.grouped_reducescatter_async(ts, name=name, **kw)),
                }
                inputs = [value(rank, (2 * size + 1, 3), dtype), value(rank, (size + 2,), dtype, seed=3)]
                for form, fn in forms.items():
                    same(f"{form}.{tag}.{op.name}.{pre:g}.{post:.3g}", fn,
                         inputs if "grouped" in form else inputs[:1], device)


def join(rank, size, device):
    """The last rank joins at once; the others reduce (it counts as zeros), then join."""
    for where in (device, torch.device("cpu")):
        results = []
        if rank != size - 1 or size == 1:
            for dtype, op in ((torch.float32, hvd.Sum), (torch.float32, hvd.Average), (torch.int32, hvd.Sum)):
                results.append(hvd.allreduce(value(rank, (5,), dtype).to(where), op=op,
                                             name=f"join.{dtype}.{op.name}.{where.type}"))
        last = hvd.join()
        if where == device:
            on_device, last_on_device = results, last
    assert last == last_on_device, (last, last_on_device)
    compare("join", on_device, results, device)


def _batch_norm_pair(params, device):
    reference, synced = torch.nn.BatchNorm2d(3).to(device, params), hvd.SyncBatchNorm(3).to(device, params)
    with torch.no_grad():
        for layer in (reference, synced):
            layer.weight.copy_(torch.linspace(0.5, 1.5, 3))
            layer.bias.copy_(torch.linspace(-1, 1, 3))
    return reference, synced


def sync_batch_norm(rank, size, device):
    """SyncBatchNorm on each rank's shard against BatchNorm2d on the whole batch (ranks hold 2, 4, 6 samples)."""
    counts = [2 * (r + 1) for r in range(size)]
    start = sum(counts[:rank])
    mine = slice(start, start + counts[rank])
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(sum(counts), 3, 4, 4, generator=generator) * 3 + 1
    weights = torch.randn(x.shape, generator=generator)
    for dtype, params, tol in ((torch.float32, torch.float32, 1e-4), (torch.float16, torch.float16, 4e-3),
                               (torch.float16, torch.float32, 4e-3)):
        reference, synced = _batch_norm_pair(params, device)
        xs, ws = x.to(device, dtype), weights.to(device, dtype)
        ref_in, my_in = xs.clone().requires_grad_(), xs[mine].clone().requires_grad_()
        ref_out, my_out = reference(ref_in), synced(my_in)
        assert my_out.device == ref_out.device and my_out.dtype == dtype, (my_out.device, my_out.dtype)
        what = f"sync batch norm {dtype} with {params} parameters"
        torch.testing.assert_close(my_out, ref_out[mine], rtol=tol, atol=tol, msg=what)
        (ref_out * ws).sum().backward()
        (my_out * ws[mine]).sum().backward()
        torch.testing.assert_close(my_in.grad, ref_in.grad[mine], rtol=tol, atol=tol, msg=f"{what}: input gradient")
        grads = torch.stack([synced.weight.grad, synced.bias.grad]).float()
        summed = hvd.allreduce(grads, op=hvd.Sum, name=f"bn.grads.{dtype}.{params}")
        torch.testing.assert_close(summed, torch.stack([reference.weight.grad, reference.bias.grad]).float(),
                                   rtol=1e-2, atol=5e-2 if params is torch.float16 else 1e-3, msg=what)
        stats = 5e-3 if params is torch.float16 else 1e-4  # float16 running statistics round at each update
        torch.testing.assert_close(synced.running_mean, reference.running_mean, rtol=stats, atol=stats, msg=what)
        torch.testing.assert_close(synced.running_var, reference.running_var, rtol=stats, atol=stats, msg=what)


def mixed_devices(rank, size, device):
    """A grouped allreduce of a CPU and a CUDA tensor fails on every rank, also where a rank's own group is
    uniform; alone (np=1) at the call."""
    if device.type == "cpu":
        return  # nothing to mix in a dry run
    error = hvd.TensorMismatchError if size > 1 else hvd.UnsupportedOperationError
    for name, mixing in (("mixed.all", range(size)), ("mixed.first", [0])):
        group = [torch.ones(2), torch.ones(2, device=device)] if rank in mixing else \
            [torch.ones(2, device=device), torch.ones(2, device=device)]
        try:
            hvd.grouped_allreduce(group, name=name)
        except error as exc:
            assert f"'{name}.0' on cpu, '{name}.1' on cuda; a group's tensors must share one device" in str(exc), exc
        else:
            raise AssertionError(f"{name}: a group mixing devices was reduced on rank {rank}")


def semantics(rank, size, device):
    for check in (allreduce_ops, allreduce_forms, gather_and_broadcast, alltoall, reducescatter, join, mixed_devices,
                  sync_batch_norm):
        check(rank, size, device)
        print(f"semantics: {check.__name__} equal on {device.type} and cpu", flush=True)


if __name__ == "__main__":
    hvd.init()
    semantics(hvd.rank(), hvd.size(), torch.device(sys.argv[1] if len(sys.argv) > 1 else "cpu"))
    print("ok semantics", flush=True)
    hvd.shutdown()
