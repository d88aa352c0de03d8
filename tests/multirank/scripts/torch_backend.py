"""torch.distributed on the "hvdlite" backend, against gloo in the same job. Usage: torch_backend.py CASE.

Every rank runs ``hvd.init()`` and ``dist.init_process_group("hvdlite")``, then builds a gloo group
over the same ranks (``dist.new_group(backend="gloo")``), so each check compares the two backends on
the same inputs, bit for bit.

collectives  every collective torch calls (all forms), async work and futures, sub-groups,
             functional collectives, send/recv: equal to gloo's (or, where gloo has no such op,
             to the value computed here). Prints 'collectives ok'.
training     DDP and torch's FSDP2 (clip_grad_norm_, get_model_state_dict, DCP save and load) on
             hvdlite and on gloo from the same weights and data: equal parameters. Prints 'training ok'.
mesh         np=4: a 2x2 device mesh (its row and column groups are process sets of their members),
             hybrid-sharded FSDP2 over it equal to the same on gloo. Prints 'mesh ok'.
mismatch     rank 0 reduces a tensor of another shape: every rank raises hvdlite's error naming
             each rank's shape. Prints 'mismatch named'.
ddp_error    rank 1 makes an extra call before a DDP step: every rank's backward raises the error
             naming each rank's calls (it crashed: an errored future reached DDP's reducer as a
             value). Prints 'ddp error named'.
killed       rank 1 is killed mid-way through DDP training: the job ends, and hvdliterun names it.
uncaught     rank 1 raises in its training loop: its traceback is printed (torch's excepthook buffers
             stderr around ours) and the job ends.
"""

import contextlib
import os
import shutil
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.algorithms.join import Join

import hvdlite.torch as hvd

torch.set_num_threads(1)


def same(a, b, what, exact=True):
    """Equal results; ``exact=False`` for sums of rounded floats over 3+ ranks, which the two
    backends add in different orders (hvdlite in rank order, as one process would)."""
    if isinstance(a, (list, tuple)):
        for x, y in zip(a, b, strict=True):
            same(x, y, what, exact)
        return
    equal = torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    assert equal, f"{what}: hvdlite {a} != gloo {b}"


def on_both(gloo, call, what):
    """``call(group)`` on the hvdlite world and on gloo; their results must be equal."""
    same(call(None), call(gloo), what)


def check_reductions(gloo, rank, size):
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3) * (rank + 1) - rank
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT):
        def reduce(group, op=op):
            t = base.clone()
            dist.all_reduce(t, op=op, group=group)
            return t
        on_both(gloo, reduce, f"all_reduce {op}")
    for dtype in (torch.int64, torch.bfloat16, torch.float64):
        def typed(group, dtype=dtype):
            t = base.to(dtype)
            dist.all_reduce(t, group=group)
            return t
        on_both(gloo, typed, f"all_reduce {dtype}")
    summed = sum(torch.arange(6, dtype=torch.float32).reshape(2, 3) * (r + 1) - r for r in range(size))
    t = base.clone()
    dist.all_reduce(t, op=dist.ReduceOp.AVG)  # gloo has no AVG
    assert torch.allclose(t, summed / size), t
    t = base.clone()
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))  # FSDP2's op; gloo has none
    assert torch.allclose(t, summed * 0.5), t
    on_both(gloo, lambda g: [t for t in [base.clone(), base[0].clone()] if not dist.all_reduce_coalesced(
        [t], group=g) or True], "all_reduce_coalesced")

    def rooted(group):
        t = base.clone()
        dist.reduce(t, dst=size - 1, group=group)
        return t if rank == size - 1 else torch.zeros(0)
    on_both(gloo, rooted, "reduce")


def check_gathers(gloo, rank, size):
    mine = torch.arange(4, dtype=torch.float32).reshape(2, 2) + 10 * rank

    def gather_list(group):
        out = [torch.empty_like(mine) for _ in range(size)]
        dist.all_gather(out, mine, group=group)
        return out
    on_both(gloo, gather_list, "all_gather")

    def gather_tensor(group):
        out = torch.empty(size * 2, 2)
        dist.all_gather_into_tensor(out, mine, group=group)
        return out
    on_both(gloo, gather_tensor, "all_gather_into_tensor")

    def rooted(group):
        out = [torch.empty_like(mine) for _ in range(size)] if rank == 0 else None
        dist.gather(mine, out, dst=0, group=group)
        return out or []
    on_both(gloo, rooted, "gather")
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank})
    assert objects == [{"rank": r} for r in range(size)], objects


def check_scatters(gloo, rank, size):
    rows = torch.arange(size * 3, dtype=torch.float32).reshape(size, 3) * (rank + 1)
    out = torch.empty(3)
    dist.reduce_scatter_tensor(out, rows)  # gloo's reduce_scatter_tensor is not in every build: computed here
    assert torch.equal(out, rows[rank] / (rank + 1) * sum(r + 1 for r in range(size))), out
    out = torch.empty(3)
    dist.reduce_scatter(out, list(rows))
    assert torch.equal(out, rows[rank] / (rank + 1) * sum(r + 1 for r in range(size))), out
    for op, expect in ((dist.ReduceOp.MAX, size), (dist.ReduceOp.MIN, 1)):  # the core scatters sums only
        out = torch.empty(3)
        dist.reduce_scatter_tensor(out, rows, op=op)
        assert torch.equal(out, rows[rank] / (rank + 1) * expect), (op, out)
    pair = [torch.empty(3), torch.empty(3)]
    with dist._coalescing_manager(async_ops=True) as coalesced:  # torch's coalesced reduce-scatter
        for out in pair:
            dist.reduce_scatter_tensor(out, rows, op=dist.ReduceOp.MAX)
    coalesced.wait()
    assert all(torch.equal(out, rows[rank] / (rank + 1) * size) for out in pair), pair

    def scatter(group):
        out = torch.empty(3)
        dist.scatter(out, list(rows) if rank == 1 else None, src=1, group=group)
        return out
    on_both(gloo, scatter, "scatter")

    def broadcast(group):
        t = rows.clone()
        dist.broadcast(t, src=size - 1, group=group)
        return t
    on_both(gloo, broadcast, "broadcast")
    # uneven all_to_all_single: rank r sends r + 1 + p rows to rank p
    send_splits = [rank + 1 + p for p in range(size)]
    recv_splits = [r + 1 + rank for r in range(size)]
    source = torch.arange(sum(send_splits) * 2, dtype=torch.float32).reshape(-1, 2) + 100 * rank

    def alltoall_single(group):
        out = torch.empty(sum(recv_splits), 2)
        dist.all_to_all_single(out, source, recv_splits, send_splits, group=group)
        return out
    on_both(gloo, alltoall_single, "all_to_all_single")

    def alltoall(group):
        out = [torch.empty(2) for _ in range(size)]  # gloo's all_to_all needs equal sizes
        dist.all_to_all(out, [torch.full((2,), float(rank * 10 + p)) for p in range(size)], group=group)
        return out
    on_both(gloo, alltoall, "all_to_all")


def check_paths_mix(rank, size):
    """One call, each rank by another path, in steady state (the names cached): blocking (the core's
    small-op path on this thread), async (the engine's cycle), a strided view (the general path).
    The same for hvdlite's own in-place call, blocking or async, under one name."""
    for step in range(9):
        t = torch.full((4,), float(rank + step))
        path = (rank + step) % 3
        if path == 0:
            dist.all_reduce(t)
        elif path == 1:
            dist.all_reduce(t, async_op=True).wait()
        else:
            strided = torch.zeros(8)[::2]
            strided.copy_(t)
            dist.all_reduce(strided)
            t = strided
        assert torch.equal(t, torch.full((4,), float(sum(range(size)) + size * step))), (step, t)
        own = torch.full((2,), float(rank * step))
        if path == 1:
            hvd.synchronize(hvd.allreduce_async_(own, name="paths.own", op=hvd.Sum))
        else:
            hvd.allreduce_(own, name="paths.own", op=hvd.Sum)
        assert torch.equal(own, torch.full((2,), float(sum(range(size)) * step))), (step, own)


def check_process_group_forms(gloo, rank, size):
    """The process group's own methods in every form torch's binding takes, and DDP's join for
    uneven inputs, which calls ``process_group.allreduce(tensor)`` (a TypeError before)."""
    def forms(group):
        pg = group or dist.group.WORLD
        t, u = torch.tensor([float(rank + 1)]), torch.tensor([float(rank + 1)])
        pg.allreduce(t).wait()
        pg.allreduce([u], dist.ReduceOp.MAX).wait()
        return [t, u]
    on_both(gloo, forms, "ProcessGroup.allreduce(tensor) and (tensors, op)")

    def joined(group):
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2), process_group=group)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        generator = torch.Generator().manual_seed(rank)
        with Join([model]):
            for _ in range(2 + rank):  # uneven inputs: the ranks that finish early shadow the others' steps
                optimizer.zero_grad()
                model(torch.randn(5, 4, generator=generator)).sum().backward()
                optimizer.step()
        return [p.detach() for p in model.parameters()]
    same(joined(None), joined(gloo), "DDP under Join with uneven inputs", exact=size < 3)


def check_async_and_groups(gloo, rank, size):
    t = torch.ones(1000) * rank
    work = dist.all_reduce(t, async_op=True)
    future = work.get_future()
    chained = future.then(lambda f: f.value()[0] * 2)  # as DDP's comm hooks chain
    assert torch.equal(chained.wait(), torch.full((1000,), 2.0 * sum(range(size)))), chained.wait()
    work.wait()
    assert work.is_completed() and work.is_success()
    check_paths_mix(rank, size)
    pair = dist.new_group([0, size - 1])
    solo = dist.new_group([1])
    if rank in (0, size - 1):
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=pair)
        assert t.item() == size - 1, t
        assert dist.get_rank(pair) == (0 if rank == 0 else 1)
    if rank == 1:
        t = torch.tensor([5.0])
        dist.all_reduce(t, group=solo)
        assert t.item() == 5.0
    got = funcol.all_reduce(torch.ones(3) * rank, "sum", dist.group.WORLD)
    assert torch.equal(got, torch.full((3,), float(sum(range(size))))), got
    got = funcol.all_gather_tensor(torch.full((2,), float(rank)), 0, dist.group.WORLD)
    assert torch.equal(got, torch.arange(size).repeat_interleave(2).float()), got
    got = funcol.reduce_scatter_tensor(torch.ones(size * 2), "sum", 0, dist.group.WORLD)
    assert torch.equal(got, torch.full((2,), float(size))), got
    if rank == 0:
        dist.send(torch.arange(3, dtype=torch.bfloat16), dst=size - 1, tag=7)
    elif rank == size - 1:
        got = torch.zeros(3, dtype=torch.bfloat16)
        dist.recv(got, src=0, tag=7)
        assert torch.equal(got, torch.arange(3, dtype=torch.bfloat16)), got
    ring = [dist.P2POp(dist.isend, torch.full((2,), float(rank)), (rank + 1) % size),
            dist.P2POp(dist.irecv, torch.empty(2), (rank - 1) % size)]
    for request in dist.batch_isend_irecv(ring):
        request.wait()
    assert torch.equal(ring[1].tensor, torch.full((2,), float((rank - 1) % size))), ring[1].tensor
    dist.barrier()


def collectives(rank, size):
    gloo = dist.new_group(backend="gloo")
    check_reductions(gloo, rank, size)
    check_gathers(gloo, rank, size)
    check_scatters(gloo, rank, size)
    check_async_and_groups(gloo, rank, size)
    check_process_group_forms(gloo, rank, size)
    print("collectives ok", flush=True)


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 4))


def ddp_params(group, rank):
    model = torch.nn.parallel.DistributedDataParallel(mlp(), process_group=group, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1 + rank)
    for _ in range(4):
        opt.zero_grad()
        model(torch.randn(6, 8)).pow(2).mean().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def fsdp2_run(mesh, rank, checkpoint_dir):
    """Three clipped steps of torch's FSDP2 on ``mesh``; a DCP round trip; the full state dict."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )
    from torch.distributed.fsdp import fully_shard

    model = mlp()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    torch.manual_seed(1 + rank)
    norms = []
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(6, 8)).pow(2).mean().backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05).full_tensor())
        opt.step()
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=checkpoint_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=checkpoint_dir)
    set_model_state_dict(model, state["model"])
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))
    return norms, [v.clone() for _, v in sorted(full.items())]


@contextlib.contextmanager
def shared_dir(rank):
    """A directory every rank sees: rank 0 makes it, and removes it once every rank is done with it."""
    objects = [tempfile.mkdtemp(prefix="hvdlite-dcp-") if rank == 0 else None]
    dist.broadcast_object_list(objects, src=0)
    try:
        yield objects[0]
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(objects[0], ignore_errors=True)


def training(rank, size):
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    gloo = dist.new_group(backend="gloo")
    exact = size == 2
    same(ddp_params(None, rank), ddp_params(gloo, rank), "DDP parameters", exact)
    with shared_dir(rank) as root:
        ours = fsdp2_run(init_device_mesh("cpu", (size,)), rank, os.path.join(root, "hvdlite"))
        theirs = fsdp2_run(DeviceMesh.from_group(gloo, "cpu"), rank, os.path.join(root, "gloo"))
    same(ours[0], theirs[0], "FSDP2 clip_grad_norm_ totals", exact)
    if rank == 0:
        same(ours[1], theirs[1], "FSDP2 full state dict after a DCP round trip", exact)
    print("training ok", flush=True)


def mesh(rank, size):
    from torch.distributed.device_mesh import init_device_mesh

    assert size == 4, "the mesh case runs at np=4"
    ours = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    assert dist.get_backend(ours["shard"].get_group()) == "hvdlite"
    rows = [[0, 1], [2, 3]]
    gloo_rows = [dist.new_group(r, backend="gloo") for r in rows]
    gloo_cols = [dist.new_group([r[i] for r in rows], backend="gloo") for i in range(2)]
    gloo_world = dist.new_group(backend="gloo")
    del gloo_world  # every rank enters each new_group; the mesh below uses the row and column groups
    from torch.distributed.device_mesh import DeviceMesh

    theirs = DeviceMesh.from_group([gloo_cols[rank % 2], gloo_rows[rank // 2]], "cpu", mesh=torch.tensor(rows),
                                   mesh_dim_names=("replicate", "shard"))
    with shared_dir(rank) as root:
        a = fsdp2_run(ours, rank, os.path.join(root, "hvdlite"))
        b = fsdp2_run(theirs, rank, os.path.join(root, "gloo"))
    same(a[0], b[0], "HSDP clip_grad_norm_ totals")
    if rank == 0:
        same(a[1], b[1], "HSDP full state dict")
    print("mesh ok", flush=True)


def mismatch(rank, size):
    """Twice: on the first call, then after the same call was cached (the response cache answers it
    on the ranks that keep it, so no round shows the difference until the waiting is noticed)."""
    for warm in (False, True):
        for _ in range(12 if warm else 0):
            dist.all_reduce(torch.ones(3))
        started = time.monotonic()
        try:
            dist.all_reduce(torch.ones(3 if rank else 4))
        except hvd.HvdliteError as error:
            text = str(error)
            assert "float32[4]" in text and "float32[3]" in text and "rank 0" in text and "rank 1" in text, text
            print(f"mismatch named after {time.monotonic() - started:.1f} s (cached: {warm})", flush=True)
            continue
        raise AssertionError("an allreduce of different shapes returned")


def ddp_error(rank, size):
    model = torch.nn.parallel.DistributedDataParallel(mlp())
    model(torch.randn(6, 8)).sum().backward()
    if rank == 1:
        dist.all_reduce(torch.ones(7), async_op=True)  # a call the others do not make
    try:
        model(torch.randn(6, 8)).sum().backward()
    except RuntimeError as error:
        named = "ranks made different calls" in str(error) and "float32[7]" in str(error)
        # rank 1's step call may come after the divergence failed the others' calls: it then learns
        # that they will never make it (they went on, and shut down)
        assert named or (rank == 1 and "can never complete" in str(error)), error
        print("ddp error named", flush=True)
        return
    raise AssertionError("a DDP step with diverged calls returned")


def killed(rank, size):
    import signal

    model = torch.nn.parallel.DistributedDataParallel(mlp())
    for step in range(1000):
        if rank == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        model(torch.randn(6, 8)).sum().backward()


def uncaught(rank, size):
    model = torch.nn.parallel.DistributedDataParallel(mlp())
    model(torch.randn(6, 8)).sum().backward()
    if rank == 1:
        raise RuntimeError("boom from a DDP training loop")
    model(torch.randn(6, 8)).sum().backward()


if __name__ == "__main__":
    hvd.init()
    dist.init_process_group("hvdlite")
    {"collectives": collectives, "training": training, "mesh": mesh,
     "mismatch": mismatch, "ddp_error": ddp_error, "killed": killed, "uncaught": uncaught}[sys.argv[1]](dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()
