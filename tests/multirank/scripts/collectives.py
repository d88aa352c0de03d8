"""Every collective, dtype and handle form, checked against values each rank computes locally.

Every rank builds every other rank's input from (rank, seed), so it knows the exact answer. One
body runs for every framework (argument: numpy, torch, tensorflow, tensorflow-graph, which runs
every collective inside a ``tf.function``, jax, or jax-jit, which runs them inside ``jax.jit``):
inputs are made as NumPy arrays and converted with ``T`` on the way in and ``N`` on the way out, as mpi4py's arrayimpl does.
"""

import itertools
import sys

import ml_dtypes
import numpy as np

# One job may run the body for both forms of a framework in turn ("tensorflow,tensorflow-graph"):
# TensorFlow's start costs seconds a rank. VARIANTS maps each form to its namespace.
FRAMEWORKS = sys.argv[1].split(",") if len(sys.argv) > 1 else ["numpy"]
FRAMEWORK = FRAMEWORKS[0]
if FRAMEWORK == "torch":
    import torch

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    VARIANTS = {"torch": hvd}

    def T(array):
        array = np.asarray(array)
        if array.dtype == ml_dtypes.bfloat16:
            return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
        return torch.from_numpy(array.copy())

    def N(tensor):
        assert isinstance(tensor, torch.Tensor), type(tensor)
        if tensor.dtype == torch.bfloat16:
            return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return tensor.numpy()
elif FRAMEWORK.startswith("tensorflow"):
    import types

    import tensorflow as tf

    import hvdlite.tensorflow as hvd

    def traced(fn):
        return lambda *args, **kwargs: tf.function(lambda: fn(*args, **kwargs), autograph=False)()

    VARIANTS = {"tensorflow": hvd, "tensorflow-graph": types.SimpleNamespace(**{
        name: traced(getattr(hvd, name)) if name in {
            "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "alltoall",
            "reducescatter", "grouped_reducescatter", "barrier"} else getattr(hvd, name) for name in hvd.__all__})}

    def T(array):
        return tf.constant(np.asarray(array))

    def N(tensor):
        assert isinstance(tensor, tf.Tensor), type(tensor)
        return tensor.numpy()
elif FRAMEWORK.startswith("jax"):
    import types

    import jax

    jax.config.update("jax_enable_x64", True)  # int64 and float64 stay 64-bit, as in the other frameworks
    import jax.numpy as jnp

    import hvdlite.jax as hvd

    def traced(fn):
        return lambda *args, **kwargs: jax.jit(lambda *a: fn(*a, **kwargs))(*args)

    host_alltoall = hvd.alltoall

    def jit_alltoall(tensor, splits=None, name=None):  # with splits the output size is not static
        if splits is not None:
            return host_alltoall(tensor, splits, name)
        return traced(host_alltoall)(tensor, name=name)

    # allgather stays on the host: this body gathers uneven first dimensions (jax_api.py covers jit).
    jitted = types.SimpleNamespace(**{name: traced(getattr(hvd, name)) if name in {
        "allreduce", "grouped_allreduce", "broadcast", "reducescatter", "grouped_reducescatter"}
        else getattr(hvd, name) for name in hvd.__all__})
    jitted.alltoall = jit_alltoall
    VARIANTS = {"jax": hvd, "jax-jit": jitted}

    def T(array):
        return jnp.asarray(array)

    def N(array):
        assert isinstance(array, jax.Array), type(array)
        return np.asarray(array)
else:
    import hvdlite as hvd

    VARIANTS = {"numpy": hvd}

    def T(array):
        return array

    def N(array):
        return array


def A2A(tensor, splits=None, name=None):
    """alltoall as (received, received splits or None). The adapters, like Horovod's, return the
    received tensor alone without ``splits`` and a pair with them; the core always returns a pair."""
    if FRAMEWORK == "numpy":
        return hvd.alltoall(tensor, splits=splits, name=name)
    if splits is None:
        return hvd.alltoall(tensor, name=name), None
    out, received = hvd.alltoall(tensor, splits=splits, name=name)
    return out, np.asarray(received)


DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
FLOATS = (np.float16, ml_dtypes.bfloat16, np.float32, np.float64)


def data(rank, shape, dtype, salt=0):
    rng = np.random.default_rng(1000 * salt + rank)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype in FLOATS:
        return rng.uniform(-4, 4, size=shape).astype(dtype)
    return rng.integers(1, 4, size=shape).astype(dtype)


def check(got, want, what, tol=0.0):
    assert got.dtype == np.dtype(want.dtype), f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol) if tol else np.array_equal(got, want)
    assert ok, f"{what}: got {got.ravel()[:6]} want {want.ravel()[:6]}"


def reduce_expected(inputs, op, dtype, size, prescale=1.0, postscale=1.0):
    wide = [x.astype(np.float64) * prescale for x in inputs]
    if op == hvd.Sum or op == hvd.Average:
        out = np.sum(wide, axis=0)
    elif op == hvd.Min:
        out = np.min(wide, axis=0)
    elif op == hvd.Max:
        out = np.max(wide, axis=0)
    else:
        out = np.prod(wide, axis=0)
    if op == hvd.Average:
        out = out / size if np.dtype(dtype).kind == "f" or dtype == ml_dtypes.bfloat16 else np.trunc(out / size)
    return (out * postscale).astype(dtype)


def test_allreduce(rank, size):
    # Each name twice: the second call is answered by the response cache, and a small tensor then
    # rides with the negotiation's vector (one host: shared memory) and every rank reduces it itself.
    for step, dtype in itertools.product(range(2), DTYPES):
        for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product):
            shape = (3, 5)
            inputs = [data(r, shape, dtype, salt=int(op) + 10 * step) for r in range(size)]
            got = N(hvd.allreduce(T(inputs[rank]), op=op, name=f"ar.{np.dtype(dtype).name}.{op.name}"))
            want = reduce_expected(inputs, op, dtype, size)
            # 16-bit floats are reduced in float32 and rounded once: equal to the float32 result rounded.
            check(got, want, f"allreduce {np.dtype(dtype).name} {op.name} (call {step + 1})",
                  tol=1e-2 if dtype in (np.float16, ml_dtypes.bfloat16) else 1e-6)
    for step, (op, want_fn) in itertools.product(range(2), ((hvd.Sum, np.any), (hvd.Max, np.any), (hvd.Min, np.all),
                                                          (hvd.Product, np.all))):
        inputs = [data(r, (7,), np.bool_, salt=int(op) + 10 * step) for r in range(size)]
        got = N(hvd.allreduce(T(inputs[rank]), op=op, name=f"ar.bool.{op.name}"))
        check(got, want_fn(inputs, axis=0), f"allreduce bool {op.name} (call {step + 1})")
    # scale factors, and the deprecated average= flag
    inputs = [data(r, (4,), np.float32) for r in range(size)]
    got = N(hvd.allreduce(T(inputs[rank]), op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0, name="ar.scaled"))
    check(got, reduce_expected(inputs, hvd.Sum, np.float32, size, 0.5, 3.0), "scaled allreduce", 1e-5)
    # Integer tensors are scaled as in Horovod: each value times the factor, truncated toward zero,
    # before the reduction (prescale) and after it (postscale); Average divides after the postscale.
    ints = [np.array([3, -3, 7, 1], np.int32) + r for r in range(size)]
    for op in (hvd.Sum, hvd.Average):
        pre = [np.trunc(x * 0.5) for x in ints]
        total = np.sum(pre, axis=0) * 3.0 / (size if op == hvd.Average else 1)
        got = N(hvd.allreduce(T(ints[rank]), op=op, prescale_factor=0.5, postscale_factor=3.0, name=f"ar.int.{op.name}"))
        check(got, np.trunc(total).astype(np.int32), f"scaled int32 {op.name}")
    rows = [np.arange(2 * size, dtype=np.int64).reshape(size, 2) * (r + 1) for r in range(size)]
    got = N(hvd.reducescatter(T(rows[rank]), op=hvd.Sum, prescale_factor=1.5, name="rs.int.scaled"))
    want = np.sum([np.trunc(x * 1.5) for x in rows], axis=0).astype(np.int64)[rank : rank + 1]
    check(got, want, "scaled int64 reducescatter")
    got = N(hvd.allreduce(T(inputs[rank]), average=False, name="ar.average_false"))
    check(got, reduce_expected(inputs, hvd.Sum, np.float32, size), "average=False", 1e-5)
    # a scalar and an empty tensor
    check(N(hvd.allreduce(T(np.float64(rank)), op=hvd.Sum, name="ar.scalar")), np.array(size * (size - 1) / 2), "scalar")
    check(N(hvd.allreduce(T(np.zeros((0, 3), np.float32)), name="ar.empty")), np.zeros((0, 3), np.float32), "empty")


def test_fp16_exact(rank, size):
    # Values whose float16 sum overflows/rounds differently when accumulated in float16.
    x = np.full(8, 60000.0 if rank == 0 else -59999.0, dtype=np.float16)
    got = N(hvd.allreduce(T(x), op=hvd.Sum, name="fp16.exact"))
    inputs = [np.full(8, 60000.0 if r == 0 else -59999.0, dtype=np.float16) for r in range(size)]
    want = np.sum([i.astype(np.float32) for i in inputs], axis=0).astype(np.float16)
    assert np.array_equal(got, want), (got, want)
    b = np.full(8, 256.0 if rank == 0 else 1.0, dtype=ml_dtypes.bfloat16)
    got = N(hvd.allreduce(T(b), op=hvd.Sum, name="bf16.exact"))
    want_b = np.sum([np.full(8, 256.0 if r == 0 else 1.0, np.float32) for r in range(size)], axis=0).astype(ml_dtypes.bfloat16)
    assert np.array_equal(got, want_b), (got, want_b)


def test_grouped_and_fusion(rank, size):
    shapes = [(2,), (100,), (50, 3), (20000,), (3, 4, 5)]  # small ones fuse; 20000 floats go direct
    for step in range(3):  # repeated names: steps 2 and 3 run from the response cache
        inputs = [[data(r, s, np.float32, salt=step * 10 + i) for i, s in enumerate(shapes)] for r in range(size)]
        outs = [N(o) for o in hvd.grouped_allreduce([T(x) for x in inputs[rank]], name="grads", op=hvd.Average)]
        for i, out in enumerate(outs):
            want = reduce_expected([inputs[r][i] for r in range(size)], hvd.Average, np.float32, size)
            check(out, want, f"grouped step {step} member {i}", 1e-5)
        if not hasattr(hvd, "allreduce_async"):  # horovod.tensorflow has no handle API
            continue
        handles = [hvd.allreduce_async(T(inputs[rank][i]), name=f"param.{i}", op=hvd.Sum) for i in range(len(shapes))]
        for i, handle in enumerate(handles):
            out = N(hvd.synchronize(handle))
            assert hvd.poll(handle)
            check(out, reduce_expected([inputs[r][i] for r in range(size)], hvd.Sum, np.float32, size), f"async {i}", 1e-5)


def test_allgather(rank, size):
    for dtype in DTYPES + [np.bool_]:
        inputs = [data(r, (r + 1, 3), dtype) for r in range(size)]  # first dimension differs per rank
        got = N(hvd.allgather(T(inputs[rank]), name=f"ag.{np.dtype(dtype).name}"))
        check(got, np.concatenate(inputs), f"allgather {np.dtype(dtype).name}")
    inputs = [[data(r, (r + 2,), np.int32, salt=1), data(r, (1, 2), np.float64, salt=2)] for r in range(size)]
    outs = [N(o) for o in hvd.grouped_allgather([T(x) for x in inputs[rank]], name="gag")]
    for i in range(2):
        check(outs[i], np.concatenate([inputs[r][i] for r in range(size)]), f"grouped allgather {i}")


def test_broadcast(rank, size):
    for root in range(size):
        for dtype in DTYPES + [np.bool_]:
            inputs = [data(r, (2, 3), dtype, salt=root) for r in range(size)]
            got = N(hvd.broadcast(T(inputs[rank]), root_rank=root, name=f"bc.{root}.{np.dtype(dtype).name}"))
            check(got, inputs[root], f"broadcast root {root} {np.dtype(dtype).name}")
            assert got is not inputs[rank]


def test_alltoall(rank, size):
    for dtype in (np.int32, ml_dtypes.bfloat16, np.float64, np.bool_):
        # rank r sends (r + d + 1) rows to rank d
        splits = [[r + d + 1 for d in range(size)] for r in range(size)]
        inputs = [data(r, (sum(splits[r]), 2), dtype) for r in range(size)]
        out, received = A2A(T(inputs[rank]), splits=splits[rank], name=f"a2a.{np.dtype(dtype).name}")
        out = N(out)
        pieces = []
        for src in range(size):
            start = sum(splits[src][:rank])
            pieces.append(inputs[src][start : start + splits[src][rank]])
        check(out, np.concatenate(pieces), f"alltoall {np.dtype(dtype).name}")
        assert received.tolist() == [splits[src][rank] for src in range(size)], received
    even = np.arange(size * 2, dtype=np.float32) + 100 * rank
    out, _ = A2A(T(even), name="a2a.even")
    out = N(out)
    want = np.concatenate([np.arange(size * 2, dtype=np.float32)[2 * rank : 2 * rank + 2] + 100 * s for s in range(size)])
    check(out, want, "alltoall without splits")


def test_reducescatter(rank, size):
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16, np.int64):
        rows = 2 * size + 1  # uneven: the first rank gets one more row
        inputs = [data(r, (rows, 2), dtype) for r in range(size)]
        for op in (hvd.Sum, hvd.Average):
            got = N(hvd.reducescatter(T(inputs[rank]), op=op, name=f"rs.{np.dtype(dtype).name}.{op.name}"))
            full = reduce_expected(inputs, op, dtype, size)
            counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
            start = sum(counts[:rank])
            tol = 1e-2 if dtype in (np.float16, ml_dtypes.bfloat16) else 1e-6
            check(got, full[start : start + counts[rank]], f"reducescatter {np.dtype(dtype).name} {op.name}", tol)
    inputs = [[data(r, (size, 3), np.float32, salt=i) for i in range(2)] for r in range(size)]
    outs = [N(o) for o in hvd.grouped_reducescatter([T(x) for x in inputs[rank]], op=hvd.Sum, name="grs")]
    for i in range(2):
        check(outs[i], reduce_expected([inputs[r][i] for r in range(size)], hvd.Sum, np.float32, size)[rank : rank + 1], f"grouped rs {i}", 1e-5)


def test_objects_and_barrier(rank, size):
    obj = {"rank": rank, "fn": (lambda x: x + rank) if rank == 0 else None, "big": list(range(1000 * (rank + 1)))}
    got = hvd.broadcast_object(obj, root_rank=0)
    assert got["rank"] == 0 and got["fn"](1) == 1 and len(got["big"]) == 1000
    everyone = hvd.allgather_object({"rank": rank, "sq": rank * rank})
    assert [e["rank"] for e in everyone] == list(range(size)) and everyone[-1]["sq"] == (size - 1) ** 2
    for _ in range(3):
        hvd.barrier()


def test_join_then_objects(rank, size):
    """Horovod's join tests, then its object collectives: while the last rank has joined, the others'
    unnamed allgather/broadcast/alltoall/reducescatter fail (they cannot run under join) and shift the
    counters of unnamed calls on those ranks alone. Object collectives are named after the object's
    type, as in Horovod, so they still agree; unnamed tensor collectives now fail, on every rank, naming
    the divergence (never a stall)."""
    calls = {"allgather": lambda: hvd.allgather(T(np.ones((1, 2), np.float32))),
             "broadcast": lambda: hvd.broadcast(T(np.ones(2, np.float32)), root_rank=0),
             "alltoall": lambda: hvd.alltoall(T(np.ones(size, np.float32))),
             "reducescatter": lambda: hvd.reducescatter(T(np.ones((size, 2), np.float32)), op=hvd.Sum)}
    for what, call in calls.items():
        if rank != size - 1:
            failure = caught(call)
            assert failure is not None and f"{what} of tensor" in failure and "called join()" in failure, failure
        last = hvd.join()
        assert hvd.allgather_object(last) == [last] * size, what
        assert hvd.broadcast_object({"last": last, "from": rank}, root_rank=size - 1) == {"last": last, "from": size - 1}
    if FRAMEWORK in ("numpy", "torch", "jax", "tensorflow"):  # eager names; compiled ones are made when traced
        failure = caught(lambda: hvd.allgather(T(np.ones((1, 2), np.float32))))
        assert failure is not None and "different sequences of unnamed allgather" in failure, failure
    assert hvd.allgather_object(rank) == list(range(size))
    # Ranks that pass objects of different types (None off the root) disagree on the name: an error, not a stall.
    failure = caught(lambda: hvd.broadcast_object({"x": 1} if rank == 0 else None, root_rank=0))
    assert failure is not None and "broadcast_object with objects of different types" in failure, failure


def caught(call):
    """The message of the error ``call`` raised (with its type's name), or None."""
    try:
        call()
    except Exception as exc:  # each framework raises its own type; the message says what failed
        return f"{type(exc).__name__}: {exc}"
    return None


def test_topology(rank, size):
    assert hvd.local_rank() == rank and hvd.local_size() == size
    assert hvd.cross_rank() == 0 and hvd.cross_size() == 1 and hvd.is_homogeneous()
    assert hvd.mpi_enabled() and hvd.mpi_built() and hvd.mpi_threads_supported()
    from hvdlite.gpu import nccl

    assert hvd.nccl_built() == (nccl.version() if nccl.available() else 0) and isinstance(hvd.nccl_built(), int)
    assert not hvd.gloo_built() and not hvd.gloo_enabled()


def main():
    global FRAMEWORK, hvd
    for FRAMEWORK in FRAMEWORKS:
        hvd = VARIANTS[FRAMEWORK]
        run_body()


def run_body():
    """Every check, then shutdown -> init -> shutdown; each line printed is "ok <framework> <check>"."""
    hook_before = sys.excepthook
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    for test in (test_topology, test_allreduce, test_fp16_exact, test_grouped_and_fusion, test_allgather,
                 test_broadcast, test_alltoall, test_reducescatter, test_objects_and_barrier, test_join_then_objects):
        test(rank, size)
        print(f"ok {FRAMEWORK} {test.__name__}", flush=True)
    hvd.shutdown()
    assert not hvd.is_initialized()
    # shutdown leaves nothing behind: no exception hook, no cached buffers
    from hvdlite.core.runtime import current
    from hvdlite.utils import buffers

    assert sys.excepthook is hook_before, "shutdown left hvdlite's exception hook installed"
    assert buffers._pool.cached_bytes == 0, "shutdown kept cached buffers"
    # init -> shutdown -> init works, and the new runtime starts fresh
    hvd.init()
    assert len(current().descriptions) == 0 and not current().adapter_state, "the new runtime inherited state"
    assert N(hvd.allreduce(T(np.ones(3)), op=hvd.Sum, name="after.reinit")).tolist() == [size] * 3
    hvd.shutdown()
    print(f"ok {FRAMEWORK} reinit", flush=True)


if __name__ == "__main__":
    main()
