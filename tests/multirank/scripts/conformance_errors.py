"""The error cases of torch_conformance.py: bad roots and peers, wrong sizes, diverged calls.

Where gloo raises, hvdlite must raise an exception of the same built-in type. Where gloo aborts the
process, hangs, or accepts what it should not (``hvdlite_only``), the case checks that hvdlite
raises on every rank of the group the error that names what was wrong.
"""

import datetime
import time

import torch
import torch.distributed as dist

import hvdlite.torch as hvd


def raises(call, error_type, *words):
    """Run ``call``; it must raise ``error_type`` whose message holds every one of ``words``."""
    try:
        call()
    except error_type as error:
        missing = [w for w in words if w not in str(error)]
        assert not missing, f"{type(error).__name__} without {missing}: {error}"
        return type(error).__name__
    raise AssertionError(f"no {error_type.__name__} raised")


def add_error_cases(case):  # noqa: C901 - one registration per case
    def errors(name, groups=("world", "tail"), hvdlite_only=False):
        return case(name, groups=groups, hvdlite_only=hvdlite_only, errors=True)

    @errors("reduce to dst=world_size")
    def _(ctx):
        dist.reduce(ctx.data((2,)), dst=dist.get_world_size(), group=ctx.group)

    @errors("reduce to group_dst=group size")
    def _(ctx):
        dist.reduce(ctx.data((2,)), group_dst=ctx.size, group=ctx.group)

    @errors("broadcast from src=world_size")
    def _(ctx):
        dist.broadcast(ctx.data((2,)), src=dist.get_world_size(), group=ctx.group)

    @errors("gather to dst=world_size")
    def _(ctx):
        dist.gather(ctx.data((2,)), None, dst=dist.get_world_size(), group=ctx.group)

    @errors("send to dst=world_size")
    def _(ctx):
        if ctx.grank == 0:
            dist.send(ctx.data((2,)), dst=dist.get_world_size(), group=ctx.group)

    @errors("all_gather_into_tensor into an output of the wrong size")
    def _(ctx):
        dist.all_gather_into_tensor(torch.empty(ctx.size * 2 + 1), ctx.data((2,)), group=ctx.group)

    @errors("all_reduce of a float tensor with BAND", hvdlite_only=True)
    def _(ctx):
        # gloo's error comes from its worker thread, at once or at a later call of the group
        raises(lambda: dist.all_reduce(ctx.data((2,)), op=dist.ReduceOp.BAND, group=ctx.group),
               hvd.InvalidArgumentError, "reduces integer and bool tensors, not torch.float32")

    @errors("recv into a tensor larger than the message", groups=("world",), hvdlite_only=True)
    def _(ctx):
        # gloo fills the start of the tensor and leaves the rest: hvdlite names both sizes
        if ctx.grank == 0:
            dist.send(torch.ones(2), dst=ctx.ranks[1], group=ctx.group)
        elif ctx.grank == 1:
            raises(lambda: dist.recv(torch.zeros(4), src=ctx.ranks[0], group=ctx.group), hvd.TensorMismatchError,
                   "has 8 bytes", "float32[4] 16")

    @errors("recv into a tensor smaller than the message", groups=("world",), hvdlite_only=True)
    def _(ctx):
        # gloo aborts the receiving process: hvdlite raises, and the next message is received whole
        if ctx.grank == 0:
            dist.send(torch.ones(4), dst=ctx.ranks[1], group=ctx.group)
            dist.send(torch.full((2,), 3.0), dst=ctx.ranks[1], group=ctx.group)
        elif ctx.grank == 1:
            raises(lambda: dist.recv(torch.zeros(2), src=ctx.ranks[0], group=ctx.group), hvd.TensorMismatchError,
                   "recv from group rank 0")
            got = torch.zeros(2)
            dist.recv(got, src=ctx.ranks[0], group=ctx.group)
            assert torch.equal(got, torch.full((2,), 3.0)), got

    @errors("scatter with a short scatter_list on the root", hvdlite_only=True)
    def _(ctx):
        # gloo raises on the root and leaves the others waiting: hvdlite raises on every rank
        if ctx.size < 2:
            return  # (an empty list is no list to torch)
        pieces = [torch.ones(2)] * (ctx.size - 1) if ctx.grank == 0 else None
        call = lambda: dist.scatter(torch.empty(2), pieces, src=ctx.ranks[0], group=ctx.group)  # noqa: E731
        if ctx.grank == 0:
            raises(call, hvd.InvalidArgumentError, "scatter_list has", f"the group {ctx.size} ranks")
        else:
            raises(call, hvd.TensorMismatchError, "ranks made different calls", "refused")

    @errors("different collectives on different ranks", hvdlite_only=True)
    def _(ctx):
        # gloo mixes the two calls' bytes or waits forever: hvdlite names each rank's call at once
        t = ctx.data((3,))
        call = (lambda: dist.all_reduce(t, group=ctx.group)) if ctx.grank == 0 else (
            lambda: dist.broadcast(t, src=ctx.ranks[0], group=ctx.group))
        started = time.monotonic()
        if ctx.size > 1:
            raises(call, hvd.TensorMismatchError, "ranks made different calls", "allreduce float32[3]",
                   "broadcast float32[3]")
            assert time.monotonic() - started < 30, time.monotonic() - started

    @errors("monitored_barrier that a rank skips", groups=("world",), hvdlite_only=True)
    def _(ctx):
        # gloo names the missing rank on rank 0 only; the others time out: hvdlite names it on each
        if ctx.grank == ctx.size - 1:
            return
        raises(lambda: dist.monitored_barrier(ctx.group, timeout=datetime.timedelta(seconds=2),
                                              wait_all_ranks=True), hvd.HvdliteError, f"[{ctx.size - 1}]",
               "did not reach it within 2 s")

    @errors("a call and a recv wait past their group's timeout", groups=("world",), hvdlite_only=True)
    def _(ctx):
        # gloo raises on the waiting ranks after the timeout and leaves the late rank to its own:
        # hvdlite names the late rank on every rank, the late one included when it comes
        group = dist.new_group(ctx.ranks, timeout=datetime.timedelta(seconds=3))
        late = ctx.ranks[-1]
        started = time.monotonic()
        if ctx.rank == late:
            time.sleep(8)  # the deadline is seen within two idle cycles (HVDLITE_IDLE_CYCLE_SECONDS) after 3 s
        raises(lambda: dist.all_reduce(torch.ones(7), group=group), hvd.StallError,
               "past its group's timeout of 3 s", f"not by rank(s) [{late}]")
        if ctx.rank != late:
            assert time.monotonic() - started < 30, time.monotonic() - started
        if ctx.grank == 0:  # a message that never comes
            raises(lambda: dist.recv(torch.empty(1), src=ctx.ranks[1], tag=99, group=group), hvd.HvdliteError,
                   "did not answer within 3 s")

    @errors("a call answered by the cache waits past its group's timeout", groups=("world",), hvdlite_only=True)
    def _(ctx):
        # In steady state the response cache answers a group's calls without the coordinator, which
        # acts on the timeout: a waiting call must reach it in time (by half the timeout).
        group = dist.new_group(ctx.ranks, timeout=datetime.timedelta(seconds=2))
        for _ in range(6):
            dist.all_reduce(torch.ones(5), group=group)
        late = ctx.ranks[-1]
        started = time.monotonic()
        if ctx.rank == late:
            time.sleep(9)
        raises(lambda: dist.all_reduce(torch.ones(5), group=group), hvd.StallError,
               "past its group's timeout of 2 s", f"not by rank(s) [{late}]")
        if ctx.rank != late:  # before: only once the coordinator looked at cached calls at all, after 5-7 s
            assert time.monotonic() - started < 6.5, time.monotonic() - started
