"""hvd.SyncBatchNorm against one process's torch.nn.BatchNorm on the whole batch.

Ranks hold different numbers of samples (rank r: 2 * (r + 1)); the loss is a sum over samples with
fixed weights, so each rank's input gradient must equal the whole-batch gradient's rows for its
samples. Checks outputs, input gradients, the summed weight and bias gradients, the running
statistics and eval-mode outputs, for 2-D and 3-D inputs, with momentum and with momentum=None,
on a process set, and float16 inputs (float16 or float32 parameters) against BatchNorm2d. Prints 'ok sync batch norm'.
"""

import torch

import hvdlite.torch as hvd


def whole_batch(size: int, shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    generator = torch.Generator().manual_seed(seed)
    counts = [2 * (r + 1) for r in range(size)]
    x = torch.randn(sum(counts), *shape, generator=generator, dtype=torch.float64) * 3 + 1
    return x, torch.randn(x.shape, generator=generator, dtype=torch.float64), counts


def check(members: list[int], shape: tuple[int, ...], momentum: float | None, process_set, seed: int) -> None:
    me = members.index(hvd.rank())
    x, weights, counts = whole_batch(len(members), shape, seed)
    start = sum(counts[:me])
    mine = slice(start, start + counts[me])
    channels = shape[0]
    reference = torch.nn.BatchNorm1d(channels, momentum=momentum).double()
    synced = hvd.SyncBatchNorm(channels, momentum=momentum, process_set=process_set).double()
    with torch.no_grad():
        for layer in (reference, synced):
            layer.weight.copy_(torch.linspace(0.5, 1.5, channels))
            layer.bias.copy_(torch.linspace(-1, 1, channels))
    for step in range(2):
        xs = x * (step + 1)
        ref_in, my_in = xs.clone().requires_grad_(), xs[mine].clone().requires_grad_()
        ref_out, my_out = reference(ref_in), synced(my_in)
        assert torch.allclose(my_out, ref_out[mine], atol=1e-10), (my_out, ref_out[mine])
        (ref_out * weights).sum().backward()
        (my_out * weights[mine]).sum().backward()
        assert torch.allclose(my_in.grad, ref_in.grad[mine], atol=1e-10), (my_in.grad, ref_in.grad[mine])
    summed = hvd.allreduce(torch.stack([synced.weight.grad, synced.bias.grad]), op=hvd.Sum, name=f"bn.grads.{seed}",
                           process_set=process_set)
    assert torch.allclose(summed, torch.stack([reference.weight.grad, reference.bias.grad]), atol=1e-9), summed
    assert torch.allclose(synced.running_mean, reference.running_mean, atol=1e-10)
    assert torch.allclose(synced.running_var, reference.running_var, atol=1e-10)
    synced.eval(), reference.eval()
    assert torch.allclose(synced(x[mine]), reference(x)[mine], atol=1e-10)


def check_half(params: torch.dtype, seed: int) -> None:
    """float16 inputs, with ``params`` parameters, against torch's BatchNorm2d on the whole batch: both
    normalize in float32 and round once, so they agree up to float16's rounding."""
    size, me = hvd.size(), hvd.rank()
    x, weights, counts = whole_batch(size, (3, 2, 2), seed)
    x, weights = x.half(), weights.half()
    start = sum(counts[:me])
    mine = slice(start, start + counts[me])
    reference, synced = torch.nn.BatchNorm2d(3).to(params), hvd.SyncBatchNorm(3).to(params)
    with torch.no_grad():
        for layer in (reference, synced):
            layer.weight.copy_(torch.linspace(0.5, 1.5, 3))
            layer.bias.copy_(torch.linspace(-1, 1, 3))
    ref_in, my_in = x.clone().requires_grad_(), x[mine].clone().requires_grad_()
    ref_out, my_out = reference(ref_in), synced(my_in)
    assert my_out.dtype == torch.float16, my_out.dtype
    torch.testing.assert_close(my_out, ref_out[mine], rtol=1e-3, atol=4e-3)
    (ref_out * weights).sum().backward()
    (my_out * weights[mine]).sum().backward()
    assert my_in.grad.dtype == torch.float16 and synced.weight.grad.dtype == params
    torch.testing.assert_close(my_in.grad, ref_in.grad[mine], rtol=1e-3, atol=4e-3)
    summed = hvd.allreduce(torch.stack([synced.weight.grad, synced.bias.grad]).float(), op=hvd.Sum,
                           name=f"bn.half.{seed}")
    torch.testing.assert_close(summed, torch.stack([reference.weight.grad, reference.bias.grad]).float(), rtol=1e-2,
                               atol=1e-2)
    torch.testing.assert_close(synced.running_mean, reference.running_mean, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(synced.running_var, reference.running_var, rtol=1e-3, atol=1e-3)


def main() -> None:
    torch.set_num_threads(1)
    hvd.init(process_sets="dynamic")
    size = hvd.size()
    check(list(range(size)), (3,), 0.1, hvd.global_process_set, seed=1)
    check(list(range(size)), (4, 5), None, hvd.global_process_set, seed=2)
    check_half(torch.float16, seed=4)
    check_half(torch.float32, seed=5)
    tail = hvd.add_process_set(list(range(1, size)))
    if tail.included():
        check(tail.ranks, (3, 2), 0.3, tail, seed=3)
    try:
        hvd.SyncBatchNorm(3)(torch.ones(3))
        raise AssertionError("a 1-D input must be refused")
    except ValueError as exc:
        assert "at least 2D" in str(exc), exc
    hvd.shutdown()
    print("ok sync batch norm", flush=True)


if __name__ == "__main__":
    main()
