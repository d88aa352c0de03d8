import numpy as np

from hvdlite.core.pipeline.fuse import SMALL_TENSOR_BYTES, plan
from hvdlite.core.work.request import RequestMeta
from hvdlite.core.work.response import Response
from hvdlite.ops import Collective, ReduceOp


def allreduce(name, n, dtype="float32", op=ReduceOp.SUM, prescale=1.0):
    return Response(RequestMeta(name, Collective.ALLREDUCE, dtype, (n,), op, prescale))


def names(items):
    return [[r.meta.name for r in item.responses] for item in items]


def test_small_tensors_of_one_kind_share_a_buffer():
    items = plan([allreduce("a", 10), allreduce("b", 20), allreduce("c", 30)], threshold=1 << 20)
    assert names(items) == [["a", "b", "c"]] and items[0].fused


def test_large_tensors_bypass_packing_and_keep_order():
    big = SMALL_TENSOR_BYTES // 4 + 1
    items = plan([allreduce("a", 10), allreduce("big", big), allreduce("b", 10)], threshold=1 << 30)
    assert names(items) == [["a", "b"], ["big"]]
    assert not items[1].fused


def test_threshold_splits_buffers():
    n = 1000  # 4000 bytes each
    items = plan([allreduce(f"t{i}", n) for i in range(5)], threshold=8000)
    assert names(items) == [["t0", "t1"], ["t2", "t3"], ["t4"]]


def test_different_dtype_op_or_scale_never_share():
    items = plan([allreduce("f", 4), allreduce("d", 4, "float64"), allreduce("m", 4, op=ReduceOp.MAX),
                  allreduce("s", 4, prescale=0.5), allreduce("f2", 4)], threshold=1 << 20)
    assert names(items) == [["f", "f2"], ["d"], ["m"], ["s"]]


def test_sixteen_bit_floats_fuse_with_float32_on_the_wire():
    items = plan([allreduce("h", 4, "float16"), allreduce("b", 4, "bfloat16"), allreduce("f", 4)], threshold=1 << 20)
    assert names(items) == [["h", "b", "f"]]


def test_zero_threshold_disables_fusion_and_non_allreduce_stays_single():
    other = Response(RequestMeta("g", Collective.ALLGATHER, "float32", (3,)))
    items = plan([allreduce("a", 4), other, allreduce("b", 4)], threshold=0)
    assert names(items) == [["a"], ["g"], ["b"]]


def test_plan_is_deterministic():
    responses = [allreduce(f"t{i}", int(n)) for i, n in enumerate(np.random.default_rng(0).integers(1, 40000, 50))]
    assert names(plan(responses, 1 << 20)) == names(plan(list(responses), 1 << 20))
