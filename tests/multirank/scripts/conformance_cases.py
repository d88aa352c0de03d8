"""The calls torch_conformance.py runs on hvdlite's groups and on gloo's: one case per call and form.

A case is a function of a :class:`Ctx` (the group, its ranks, seeded inputs) that makes its calls
and returns what a user would look at: outputs, futures' values, ranks. Inputs are small integers,
so sums and products are exact in every dtype and order (gloo and hvdlite add in different orders).
"""

import dataclasses
import datetime
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

ALL = ("world", "head", "tail", "enum")
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
          torch.int64)
INTEGERS = (torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool)
OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX}
BITWISE = {"band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}


@dataclasses.dataclass
class Ctx:
    group: object  # None: hvdlite's default group
    ranks: list  # the group's job ranks
    rank: int  # this process's job rank
    backend: str
    seed: int

    @property
    def size(self):
        return len(self.ranks)

    @property
    def grank(self):
        return self.ranks.index(self.rank) if self.rank in self.ranks else -1

    def data(self, shape, dtype=torch.float32, low=0, high=5, rank=None):
        """Seeded integers in [low, high) as ``dtype``: the same on both backends, different per rank."""
        generator = torch.Generator().manual_seed(self.seed * 1009 + (self.rank if rank is None else rank))
        values = torch.randint(low, high, shape, generator=generator)
        return values.bool() if dtype == torch.bool else values.to(dtype)


@dataclasses.dataclass
class Case:
    name: str
    fn: Callable
    groups: tuple = ALL
    hvdlite_only: bool = False  # gloo aborts, hangs or is wrong here: the case checks hvdlite's side
    non_members: bool = False  # ranks outside the group run it too (torch's not-a-member answers)


CASES: list = []
ERROR_CASES: list = []


def case(name, groups=ALL, hvdlite_only=False, non_members=False, errors=False):
    def add(fn):
        (ERROR_CASES if errors else CASES).append(Case(name, fn, groups, hvdlite_only, non_members))
        return fn
    return add


def _async(work, outputs):
    """What a user reads of an async call: its future's value, completion, and the outputs."""
    value = work.get_future().wait()
    work.wait()
    return {"future": value, "completed": work.is_completed(), "outputs": outputs}


# ---- all_reduce --------------------------------------------------------------------------------
def _all_reduce_case(dtype, op, low, high):
    """all_reduce with ``op`` of seeded values in [low, high) (products of 1s and 2s stay exact)."""
    def fn(ctx):
        t = ctx.data((2, 3), dtype, low, high)
        dist.all_reduce(t, op=op, group=ctx.group)
        return t
    return fn


for _dtype in DTYPES:
    for _name, _op in OPS.items():
        case(f"all_reduce {_dtype} {_name}", groups=("world", "tail"))(
            _all_reduce_case(_dtype, _op, *((1, 3) if _name == "product" else (0, 5))))
for _dtype in INTEGERS:
    for _name, _op in BITWISE.items():
        case(f"all_reduce {_dtype} {_name}", groups=("world", "tail"))(_all_reduce_case(_dtype, _op, 0, 16))


@case("all_reduce async, future")
def _(ctx):
    t = ctx.data((4,))
    return _async(dist.all_reduce(t, group=ctx.group, async_op=True), t)


@case("all_reduce of an expanded tensor")
def _(ctx):
    t = ctx.data((1,)).expand(4)
    dist.all_reduce(t, group=ctx.group)
    return t


@case("all_reduce of a sparse tensor", groups=("world", "tail"))
def _(ctx):
    indices = ctx.data((1, 3), torch.int64, 0, 6)
    t = torch.sparse_coo_tensor(indices, ctx.data((3,)), (6,))
    dist.all_reduce(t, group=ctx.group)
    return t


@case("all_reduce_coalesced")
def _(ctx):
    tensors = [ctx.data((3,)), ctx.data((2, 2), torch.float64)]
    dist.all_reduce_coalesced(tensors, group=ctx.group)
    return tensors


@case("all_reduce of a 0-element tensor")
def _(ctx):
    t = torch.empty(0)
    dist.all_reduce(t, group=ctx.group)
    return t


# ---- reduce ------------------------------------------------------------------------------------
def _reduce_case(op_name, root_of):
    def fn(ctx):
        t = ctx.data((3,), torch.float32, 1, 3)
        root = root_of(ctx)
        dist.reduce(t, dst=ctx.ranks[root], op=OPS.get(op_name) or BITWISE[op_name], group=ctx.group)
        return t if ctx.grank == root else None  # elsewhere undefined (gloo leaves partial sums)
    return fn


for _op in OPS:
    case(f"reduce {_op} to the last rank")(_reduce_case(_op, lambda ctx: ctx.size - 1))


@case("reduce to group rank 0 by group_dst, async")
def _(ctx):
    t = ctx.data((3,))
    work = dist.reduce(t, group_dst=0, group=ctx.group, async_op=True)
    work.wait()
    return t if ctx.grank == 0 else None


# ---- reduce_scatter ----------------------------------------------------------------------------
@case("reduce_scatter")
def _(ctx):
    out = torch.empty(3)
    dist.reduce_scatter(out, [ctx.data((3,), rank=ctx.rank * 7 + r) for r in range(ctx.size)], group=ctx.group)
    return out


@case("reduce_scatter max")
def _(ctx):
    out = torch.empty(2, dtype=torch.int64)
    inputs = [ctx.data((2,), torch.int64, rank=ctx.rank * 7 + r) for r in range(ctx.size)]
    dist.reduce_scatter(out, inputs, op=dist.ReduceOp.MAX, group=ctx.group)
    return out


@case("reduce_scatter of uneven shapes")
def _(ctx):
    out = torch.empty(ctx.grank + 1)
    dist.reduce_scatter(out, [ctx.data((r + 1,), rank=ctx.rank * 7 + r) for r in range(ctx.size)], group=ctx.group)
    return out


@case("reduce_scatter async")
def _(ctx):
    out = torch.empty(3)
    inputs = [ctx.data((3,), rank=ctx.rank * 7 + r) for r in range(ctx.size)]
    work = dist.reduce_scatter(out, inputs, group=ctx.group, async_op=True)
    work.wait()  # (gloo's reduce_scatter work has no future; hvdlite's has: [output])
    return out


# ---- all_gather --------------------------------------------------------------------------------
@case("all_gather")
def _(ctx):
    out = [torch.empty(2, 2) for _ in range(ctx.size)]
    dist.all_gather(out, ctx.data((2, 2)), group=ctx.group)
    return out


for _dtype in (torch.bfloat16, torch.int64, torch.uint8, torch.bool):
    @case(f"all_gather {_dtype}", groups=("world", "tail"))
    def _(ctx, dtype=_dtype):
        out = [torch.empty(3, dtype=dtype) for _ in range(ctx.size)]
        dist.all_gather(out, ctx.data((3,), dtype, 0, 2), group=ctx.group)
        return out


@case("all_gather async, future")
def _(ctx):
    out = [torch.empty(2) for _ in range(ctx.size)]
    return _async(dist.all_gather(out, ctx.data((2,)), group=ctx.group, async_op=True), out)


@case("all_gather_into_tensor")
def _(ctx):
    out = torch.empty(ctx.size * 2, 3)
    dist.all_gather_into_tensor(out, ctx.data((2, 3)), group=ctx.group)
    return out


@case("all_gather_into_tensor async, future")
def _(ctx):
    out = torch.empty(ctx.size * 2)
    return _async(dist.all_gather_into_tensor(out, ctx.data((2,)), group=ctx.group, async_op=True), out)


@case("all_gather_object")
def _(ctx):
    out = [None] * ctx.size
    dist.all_gather_object(out, {"rank": ctx.rank, "items": list(range(ctx.rank))}, group=ctx.group)
    return out


# ---- gather ------------------------------------------------------------------------------------
@case("gather to the last rank")
def _(ctx):
    root = ctx.size - 1
    out = [torch.empty(3) for _ in range(ctx.size)] if ctx.grank == root else None
    dist.gather(ctx.data((3,)), out, dst=ctx.ranks[root], group=ctx.group)
    return out


@case("gather by group_dst, async")
def _(ctx):
    out = [torch.empty(2) for _ in range(ctx.size)] if ctx.grank == 0 else None
    work = dist.gather(ctx.data((2,)), out, group_dst=0, group=ctx.group, async_op=True)
    work.wait()
    return out


@case("gather_object")
def _(ctx):
    root = ctx.size - 1
    out = [None] * ctx.size if ctx.grank == root else None
    dist.gather_object(("rank", ctx.rank), out, dst=ctx.ranks[root], group=ctx.group)
    return out


# ---- broadcast ---------------------------------------------------------------------------------
def _broadcast_case(root_of, by_group_rank=False):
    def fn(ctx):
        t = ctx.data((2, 3))
        root = root_of(ctx)
        if by_group_rank:
            dist.broadcast(t, group_src=root, group=ctx.group)
        else:
            dist.broadcast(t, src=ctx.ranks[root], group=ctx.group)
        return t
    return fn


case("broadcast from group rank 0")(_broadcast_case(lambda ctx: 0))
case("broadcast from the last rank")(_broadcast_case(lambda ctx: ctx.size - 1))
case("broadcast from the last rank by group_src")(_broadcast_case(lambda ctx: ctx.size - 1, by_group_rank=True))


@case("broadcast async, future")
def _(ctx):
    t = ctx.data((4,), torch.int32)
    return _async(dist.broadcast(t, src=ctx.ranks[-1], group=ctx.group, async_op=True), t)


@case("broadcast_object_list from the last rank")
def _(ctx):
    objects = [{"from": ctx.rank}, list(range(ctx.rank + 2))]
    dist.broadcast_object_list(objects, src=ctx.ranks[-1], group=ctx.group)
    return objects


# ---- scatter -----------------------------------------------------------------------------------
@case("scatter from the last rank")
def _(ctx):
    root = ctx.size - 1
    out = torch.empty(3)
    pieces = [ctx.data((3,), rank=100 + r) for r in range(ctx.size)] if ctx.grank == root else None
    dist.scatter(out, pieces, src=ctx.ranks[root], group=ctx.group)
    return out


@case("scatter by group_src, async")
def _(ctx):
    out = torch.empty(2, dtype=torch.int64)
    pieces = [ctx.data((2,), torch.int64, rank=100 + r) for r in range(ctx.size)] if ctx.grank == 0 else None
    work = dist.scatter(out, pieces, group_src=0, group=ctx.group, async_op=True)
    work.wait()
    return out


@case("scatter_object_list")
def _(ctx):
    out = [None]
    objects = [{"for": r} for r in range(ctx.size)] if ctx.grank == 0 else None
    dist.scatter_object_list(out, objects, src=ctx.ranks[0], group=ctx.group)
    return out


# ---- all-to-all --------------------------------------------------------------------------------
@case("all_to_all")
def _(ctx):
    out = [torch.empty(2) for _ in range(ctx.size)]
    dist.all_to_all(out, [ctx.data((2,), rank=ctx.rank * 7 + r) for r in range(ctx.size)], group=ctx.group)
    return out


@case("all_to_all_single, even")
def _(ctx):
    out = torch.empty(ctx.size * 2)
    dist.all_to_all_single(out, ctx.data((ctx.size * 2,)), group=ctx.group)
    return out


@case("all_to_all_single, uneven splits")
def _(ctx):
    send = [ctx.grank + 1 + p for p in range(ctx.size)]
    recv = [r + 1 + ctx.grank for r in range(ctx.size)]
    out = torch.empty(sum(recv), 2)
    dist.all_to_all_single(out, ctx.data((sum(send), 2)), recv, send, group=ctx.group)
    return out


# ---- barriers, functional collectives ----------------------------------------------------------
@case("barrier")
def _(ctx):
    return dist.barrier(group=ctx.group)


@case("monitored_barrier")
def _(ctx):
    return dist.monitored_barrier(group=ctx.group, timeout=datetime.timedelta(seconds=30), wait_all_ranks=True)


def _funcol_group(ctx):
    return ctx.group if ctx.group is not None else dist.group.WORLD


@case("functional all_reduce, all_gather_tensor, reduce_scatter_tensor", groups=("world", "tail"))
def _(ctx):
    group = _funcol_group(ctx)
    reduced = funcol.all_reduce(ctx.data((3,)), "sum", group)
    gathered = funcol.all_gather_tensor(ctx.data((2,)), 0, group)
    scattered = funcol.reduce_scatter_tensor(ctx.data((ctx.size * 2,)), "sum", 0, group)
    return [funcol.wait_tensor(t) for t in (reduced, gathered, scattered)]


@case("functional broadcast, all_to_all_single", groups=("world", "tail"))
def _(ctx):
    group = _funcol_group(ctx)
    sent = funcol.broadcast(ctx.data((3,)), ctx.ranks[-1], group)
    swapped = funcol.all_to_all_single(ctx.data((ctx.size,)), None, None, group)
    return [funcol.wait_tensor(t) for t in (sent, swapped)]


# ---- point-to-point ----------------------------------------------------------------------------
@case("send and recv, tags out of order", groups=("world", "tail"))
def _(ctx):
    if ctx.size < 2:
        return None
    if ctx.grank == 0:
        works = [dist.isend(ctx.data((2,), rank=tag), dst=ctx.ranks[1], tag=tag, group=ctx.group) for tag in (1, 2)]
        for work in works:
            work.wait()
        return None
    if ctx.grank == 1:
        second, first = torch.empty(2), torch.empty(2)
        dist.recv(second, src=ctx.ranks[0], tag=2, group=ctx.group)
        dist.recv(first, src=ctx.ranks[0], tag=1, group=ctx.group)
        return [first, second]
    return None


@case("recv from any source", groups=("world", "tail"))
def _(ctx):
    if ctx.size < 2:
        return None
    if ctx.grank == ctx.size - 1:
        got = torch.empty(3)
        sender = dist.recv(got, group=ctx.group)
        return [sender, got]
    if ctx.grank == 0:
        dist.send(ctx.data((3,)), dst=ctx.ranks[-1], group=ctx.group)
    return None


@case("irecv from any source, its source rank", groups=("world",))
def _(ctx):
    if ctx.grank == 0:
        got = torch.empty(2)
        work = dist.irecv(got, group=ctx.group)
        work.wait()
        return [work._source_rank(), got]
    if ctx.grank == 1:
        dist.send(ctx.data((2,)), dst=ctx.ranks[0], group=ctx.group)
    return None


@case("send and recv of a 0-element tensor", groups=("world",))
def _(ctx):
    if ctx.grank == 0:
        dist.send(torch.empty(0), dst=ctx.ranks[1], group=ctx.group)
    elif ctx.grank == 1:
        got = torch.empty(0)
        dist.recv(got, src=ctx.ranks[0], group=ctx.group)
        return got
    return None


@case("batch_isend_irecv ring")
def _(ctx):
    if ctx.size < 2:
        return None
    after, before = ctx.ranks[(ctx.grank + 1) % ctx.size], ctx.ranks[(ctx.grank - 1) % ctx.size]
    got = torch.empty(3, dtype=torch.bfloat16)
    ops = [dist.P2POp(dist.isend, ctx.data((3,), torch.bfloat16), after, ctx.group),
           dist.P2POp(dist.irecv, got, before, ctx.group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return got


@case("send_object_list and recv_object_list", groups=("world",))
def _(ctx):
    if ctx.grank == 0:
        dist.send_object_list([{"a": 1}, [ctx.rank]], dst=ctx.ranks[1], group=ctx.group)
    elif ctx.grank == 1:
        got = [None, None]
        dist.recv_object_list(got, src=ctx.ranks[0], group=ctx.group)
        return got
    return None


# ---- coalesced, deprecated and functional forms ------------------------------------------------
@case("all_reduce complex64")
def _(ctx):
    t = torch.complex(ctx.data((3,)), ctx.data((3,), rank=ctx.rank + 50))
    dist.all_reduce(t, group=ctx.group)
    return t


@case("reduce_scatter_tensor")
def _(ctx):
    out = torch.empty(2, 2)
    dist.reduce_scatter_tensor(out, ctx.data((ctx.size * 2, 2)), group=ctx.group)
    return out


@case("_coalescing_manager: all_reduce, async")
def _(ctx):
    tensors = [ctx.data((3,)), ctx.data((2,))]  # (gloo refuses mixed dtypes here; hvdlite takes them)
    with dist._coalescing_manager(group=ctx.group, async_ops=True) as coalesced:
        for t in tensors:
            dist.all_reduce(t, group=ctx.group)
    coalesced.wait()
    return tensors


@case("all_gather_coalesced (deprecated)")
def _(ctx):
    outputs = [[torch.empty(2), torch.empty(1, 3)] for _ in range(ctx.size)]  # one list per rank
    dist.all_gather_coalesced(outputs, [ctx.data((2,)), ctx.data((1, 3))], group=ctx.group)
    return outputs


@case("functional coalesced forms and permute_tensor", groups=("world", "tail"))
def _(ctx):
    group = _funcol_group(ctx)
    reduced = funcol.all_reduce_coalesced([ctx.data((2,)), ctx.data((3,))], "sum", group)
    gathered = funcol.all_gather_into_tensor_coalesced([ctx.data((2,)), ctx.data((1,))], group)
    scattered = funcol.reduce_scatter_tensor_coalesced([ctx.data((ctx.size,)), ctx.data((ctx.size * 2,))], "sum",
                                                       [0, 0], group)
    permuted = funcol.permute_tensor(ctx.data((2,)), [(i + 1) % ctx.size for i in range(ctx.size)], group)
    return [funcol.wait_tensor(t) for t in (*reduced, *gathered, *scattered, permuted)]


@case("group queries")
def _(ctx):
    group = ctx.group or dist.group.WORLD
    return [dist.get_rank(group), dist.get_world_size(group), dist.get_process_group_ranks(group),
            dist.get_global_rank(group, 0), dist.get_group_rank(group, ctx.ranks[-1])]


@case("new_subgroups of one rank each, used at once", groups=("world",))
def _(ctx):
    mine, _ = dist.new_subgroups(group_size=1, backend=ctx.backend)
    t = ctx.data((3,))
    dist.all_reduce(t, group=mine)
    dist.broadcast(t, src=ctx.rank, group=mine)
    return [t, dist.get_rank(mine), dist.get_world_size(mine)]


def _computed_sum(ctx, shape):
    return sum(ctx.data(shape, rank=r) for r in ctx.ranks)


@case("all_reduce and reduce of strided views", hvdlite_only=True)
def _(ctx):
    # gloo reduces the view's underlying memory as if it were contiguous (wrong): checked against the sum here
    t = ctx.data((4, 6))
    view = t[:, ::2]
    dist.all_reduce(view, group=ctx.group)
    expected = _computed_sum(ctx, (4, 6))
    assert torch.equal(view, expected[:, ::2]) and torch.equal(t[:, 1::2], ctx.data((4, 6))[:, 1::2]), t
    t = ctx.data((4, 6))
    dist.reduce(t.t(), dst=ctx.ranks[0], group=ctx.group)
    assert ctx.grank != 0 or torch.equal(t, expected), t


@case("broadcast into a strided view", hvdlite_only=True)
def _(ctx):
    t = ctx.data((3, 4))
    dist.broadcast(t[:, 1:3], src=ctx.ranks[-1], group=ctx.group)
    expected = ctx.data((3, 4))
    expected[:, 1:3] = ctx.data((3, 4), rank=ctx.ranks[-1])[:, 1:3]
    assert torch.equal(t, expected), t


# ---- groups ------------------------------------------------------------------------------------
@case("a rank outside the group", groups=("tail", "enum"), non_members=True)
def _(ctx):
    t = ctx.data((2,))
    answers = [dist.get_rank(ctx.group) if ctx.group is not None else dist.get_rank()]
    if ctx.grank < 0:
        answers.append(dist.all_reduce(t, group=ctx.group))  # torch: a warning, None
    return answers


from conformance_errors import add_error_cases  # noqa: E402 - registers into ERROR_CASES

add_error_cases(case)
