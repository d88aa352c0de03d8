"""The torch.distributed backend's in-process parts: handle callbacks, c10d work and its future,
and torch's reduction ops in hvdlite's terms. Multi-rank behaviour: tests/multirank/test_torch_backend.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hvdlite.core.work.request import GroupHandle, Handle, MappedHandle
from hvdlite.errors import HvdliteError, UnsupportedOperationError
from hvdlite.ops import ReduceOp
from hvdlite.torch.collectives.tensors import plain_host_view
from hvdlite.torch.distributed.reductions import core_reduction, plain_reduction
from hvdlite.torch.distributed.work import HvdliteWork, core_handles


def test_done_callback_runs_once_on_delivery_or_at_once_if_delivered() -> None:
    seen: list[str] = []
    pending = Handle("a")
    pending.add_done_callback(lambda h: seen.append(f"late {h.name}"))
    assert seen == []
    pending.set_result(1)
    pending.set_result(2)  # a second completion is ignored, and so are its callbacks
    delivered = Handle("b")
    delivered.set_error(HvdliteError("x"))
    delivered.add_done_callback(lambda h: seen.append(f"early {h.name}"))
    assert seen == ["late a", "early b"]


def test_core_handles_sees_through_mapped_and_grouped_handles() -> None:
    a, b = Handle("a"), Handle("b")
    assert core_handles(GroupHandle([MappedHandle(a, str), MappedHandle(MappedHandle(b, str), str)])) == [a, b]


def test_work_future_completes_on_delivery_without_a_wait() -> None:
    handles = [Handle("a"), Handle("b")]
    out = torch.zeros(2)

    def finish(results: list[int]) -> list[torch.Tensor]:
        out.copy_(torch.tensor(results, dtype=torch.float32))
        return [out]

    work = HvdliteWork(handles, finish)
    future = work.get_future()
    chained = future.then(lambda f: f.value()[0] * 10)
    handles[0].set_result(3)
    assert not future.done() and not work.is_completed()
    handles[1].set_result(4)
    assert future.done() and torch.equal(chained.wait(), torch.tensor([30.0, 40.0]))
    assert work.wait() and work.is_success() and work.get_future() is future


def test_work_error_reaches_wait_and_the_future() -> None:
    handle = Handle("a")
    work = HvdliteWork([handle], lambda results: results)
    future = work.get_future()
    handle.set_error(HvdliteError("rank 1 died"))
    with pytest.raises(HvdliteError, match="rank 1 died"):
        work.wait()
    with pytest.raises(RuntimeError, match="rank 1 died"):
        future.wait()
    assert work.is_completed() and not work.is_success()


def test_work_without_operations_is_complete() -> None:
    work = HvdliteWork.completed("value")
    assert work.get_future().wait() == "value" and work.wait()
    assert work.is_completed() and work.is_success() and work.exception() is None and work.result() == "value"
    assert work.get_future() is not work.get_future()  # each its own completed future, as gloo's


def test_plain_host_view_shares_memory_and_leaves_the_rest_to_to_numpy() -> None:
    tensor = torch.zeros(3, requires_grad=True)
    view = plain_host_view(tensor)
    view[1] = 5.0  # the core writes results through it
    assert tensor.tolist() == [0.0, 5.0, 0.0]

    class Wrapped(torch.Tensor):  # a subclass may hold its data elsewhere (DTensor): to_numpy decides
        pass
    others = [torch.zeros(4)[::2], torch.zeros(2, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.complex64),
              torch.zeros(2).to_sparse(), torch.zeros(2).as_subclass(Wrapped), torch.zeros(2, device="meta")]
    assert [plain_host_view(t) for t in others] == [None] * len(others)
    assert plain_host_view(torch.nn.Parameter(torch.ones(2))).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("op", [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MIN, dist.ReduceOp.MAX,
                                dist.ReduceOp.PRODUCT, dist.ReduceOp.BAND, dist._make_nccl_premul_sum(0.5)])
def test_plain_reduction_is_the_core_op_where_no_scaling_or_fold_is_needed(op) -> None:
    kind = getattr(op, "op", op)
    expected = None if kind in (dist.ReduceOp.BAND, dist.ReduceOp.PREMUL_SUM) else core_reduction(op, "x")[0]
    assert plain_reduction(op) == expected
    assert plain_reduction(kind) == expected  # torch passes either form


@pytest.mark.parametrize(("op", "expected"), [
    (dist.ReduceOp.SUM, (ReduceOp.SUM, 1.0)), (dist.ReduceOp.AVG, (ReduceOp.AVERAGE, 1.0)),
    (dist.ReduceOp.MIN, (ReduceOp.MIN, 1.0)), (dist.ReduceOp.MAX, (ReduceOp.MAX, 1.0)),
    (dist.ReduceOp.PRODUCT, (ReduceOp.PRODUCT, 1.0)),
    (dist._make_nccl_premul_sum(0.25), (ReduceOp.SUM, 0.25)),
    (dist._make_nccl_premul_sum(torch.tensor(0.5)), (ReduceOp.SUM, 0.5)),
])
def test_torch_reductions_map_to_hvdlite_ops(op, expected) -> None:
    assert core_reduction(op, "all_reduce") == expected


def test_bitwise_reductions_are_refused_by_name() -> None:
    with pytest.raises(UnsupportedOperationError, match="all_reduce: the hvdlite backend does not reduce with .*BAND"):
        core_reduction(dist.ReduceOp.BAND, "all_reduce")
