"""hvdlite.jax beyond the shared collectives body: pytrees, jit-only rules, state, sharding,
compression, optimizer options and errors. Cases: comma-separated argument; prints "ok <case>"."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from checks import expect_error

import hvdlite.jax as hvd


def case_pytrees(rank, size):
    tree = {"a": jnp.full((2, 3), float(rank)), "b": [jnp.arange(4) + rank, jnp.ones((), jnp.bfloat16)]}
    for fn in (lambda t: hvd.allreduce(t, op=hvd.Sum, name="tree"), jax.jit(lambda t: hvd.allreduce(t, op=hvd.Sum))):
        out = fn(tree)
        assert jax.tree.structure(out) == jax.tree.structure(tree)
        assert np.allclose(out["a"], sum(range(size))) and out["b"][0].tolist() == [size * i + sum(range(size)) for i in range(4)]
        assert out["b"][1].dtype == jnp.bfloat16 and float(out["b"][1]) == size
    # In jit, results are written into buffers reused per call site: earlier results must not change.
    step = jax.jit(lambda t: hvd.allreduce(t, op=hvd.Sum))
    first = step(jnp.full(70000, float(rank)))
    second = step(jnp.full(70000, float(rank + 1)))
    assert float(first[0]) == sum(range(size)) and float(second[0]) == sum(range(1, size + 1)), (first, second)
    # broadcast of a pytree, in and out of jit, from a non-zero root
    root = size - 1
    for fn in (lambda t: hvd.broadcast(t, root, name="bc.tree"), jax.jit(lambda t: hvd.broadcast(t, root_rank=root))):
        out = fn(tree)
        assert np.allclose(out["a"], root) and out["b"][0].tolist() == [i + root for i in range(4)]
    # jit allgather (equal first dimensions) and jit alltoall without splits
    gathered = jax.jit(hvd.allgather)(jnp.full((2, 2), rank, jnp.int32))
    assert gathered.shape == (2 * size, 2) and gathered[:, 0].tolist() == [r for r in range(size) for _ in range(2)]
    exchanged = jax.jit(hvd.alltoall)(jnp.arange(size, dtype=jnp.float32) + 10 * rank)
    assert exchanged.tolist() == [10 * src + rank for src in range(size)]
    group = jax.jit(lambda a, b: hvd.grouped_allgather([a, b]))(jnp.ones((1, 2)) * rank, jnp.ones(3))
    assert group[0][:, 0].tolist() == list(range(size)) and group[1].shape == (3 * size,)
    hvd.barrier()
    last = hvd.join()  # which rank joins last depends on timing; every rank must hear the same one
    assert last in range(size) and hvd.allgather_object(last) == [last] * size


def case_errors(rank, size):
    others = ", ".join(f"rank {r}: ({r + 2},)" for r in range(1, size))
    want = f"Mismatched shape for allreduce of tensor 'host.shape': rank 0: (2,), {others}"
    expect_error(hvd.TensorMismatchError, want, lambda: hvd.allreduce(jnp.ones(rank + 2), name="host.shape"), "host")
    # Inside jit the core's error reaches the caller as a JaxRuntimeError carrying the same message.
    jitted = jax.jit(lambda x: hvd.allreduce(x, name="jit.shape"))
    expect_error(jax.errors.JaxRuntimeError, "Mismatched shape for allreduce of tensor 'jit.shape': rank 0: (2,)",
                 lambda: jitted(jnp.ones(rank + 2)).block_until_ready(), "jit mismatch")
    uneven = jax.jit(lambda x: hvd.allgather(x, name="jit.gather"))
    counts = ", ".join(f"rank {r}: [{r + 1}]" for r in range(size))
    expect_error(jax.errors.JaxRuntimeError, f"first dimensions per rank: {counts}",
                 lambda: uneven(jnp.ones((rank + 1, 2))).block_until_ready(), "jit uneven allgather")
    expect_error(hvd.UnsupportedOperationError, "alltoall with splits inside jax.jit",
                 lambda: jax.jit(lambda x: hvd.alltoall(x, splits=[1] * size))(jnp.ones(size)), "jit alltoall splits")
    expect_error(hvd.UnsupportedOperationError, "complex64, which hvdlite does not support",
                 lambda: hvd.allreduce(jnp.ones(2, jnp.complex64), name="cplx"), "dtype")
    expect_error(hvd.UnsupportedOperationError, "at least one dimension",
                 lambda: jax.jit(hvd.allgather)(jnp.float32(1)), "jit scalar allgather")
    expect_error(hvd.UnsupportedOperationError, "Average or Sum",
                 lambda: hvd.DistributedOptimizer(optax.sgd(0.1), op=hvd.Max), "optimizer op")
    expect_error(ValueError, "backward_passes_per_step must be a positive int",
                 lambda: hvd.DistributedOptimizer(optax.sgd(0.1), backward_passes_per_step=0), "bpps")
    expect_error(hvd.UnsupportedOperationError, "Adasum needs a floating-point",
                 lambda: hvd.allreduce(jnp.ones(2, jnp.int32), op=hvd.Adasum), "adasum int")
    expect_error(ValueError, "DistributedOptimizer(op=Adasum) cannot be combined with compression",
                 lambda: hvd.DistributedOptimizer(optax.sgd(0.1), op=hvd.Adasum, compression=hvd.Compression.fp16),
                 "adasum optimizer with compression")
    assert hvd.allreduce(jnp.ones(2), op=hvd.Adasum, name="adasum.same").tolist() == [1.0, 1.0]  # parallel: averaged
    assert hvd.allreduce(jnp.ones(2), op=hvd.Sum, name="after.errors").tolist() == [size, size]  # the job goes on


def case_state(rank, size):
    root = 1 % size
    params = {"w": jnp.full((3, 2), float(rank)), "b": jnp.arange(2.0) * rank, "step": rank, "tag": f"r{rank}"}
    got = hvd.broadcast_parameters(params, root_rank=root)
    assert np.allclose(got["w"], root) and got["b"].tolist() == [0.0, float(root)]
    assert got["step"] == root and got["tag"] == f"r{root}"
    tx = optax.adam(0.1)
    state = tx.init({"w": jnp.ones(3)})
    _, state = tx.update({"w": jnp.full(3, float(rank + 1))}, state)  # moments now differ per rank
    state = hvd.broadcast_optimizer_state(state, root_rank=0)
    assert np.allclose(state[0].mu["w"], 0.1) and int(state[0].count) == 1


def case_sharding(rank, size):
    for epoch in (0, 1):
        for n, drop_last in ((10, False), (10, True), (2, False)):
            mine = hvd.shard_indices(n, epoch, seed=5, drop_last=drop_last)
            everyone = hvd.allgather_object(mine.tolist())
            assert all(len(x) == len(mine) for x in everyone), everyone
            flat = sorted(i for x in everyone for i in x)
            if drop_last:
                assert len(set(flat)) == len(flat) == n // size * size
            else:
                assert set(flat) == set(range(n)) and len(flat) == -(-n // size) * size
    assert hvd.shard_indices(100, 0).tolist() != hvd.shard_indices(100, 1).tolist()  # reshuffled per epoch


def case_optimizer_options(rank, size):
    grads = {"w": jnp.arange(4.0) + rank}
    mean = jnp.arange(4.0) + (size - 1) / 2
    for kwargs, want in (({}, mean), ({"op": hvd.Sum}, mean * size), ({"gradient_predivide_factor": 2.0}, mean),
                         ({"compression": hvd.Compression.fp16}, mean), ({"compression": hvd.Compression.bf16}, mean)):
        tx = hvd.DistributedOptimizer(optax.sgd(1.0), **kwargs)
        for jit in (False, True):
            update = jax.jit(tx.update) if jit else tx.update
            updates, _ = update(grads, tx.init(grads))
            assert updates["w"].dtype == jnp.float32, kwargs
            assert np.allclose(updates["w"], -want, atol=1e-2), (kwargs, jit, updates["w"], want)


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def main():
    hvd.init()
    for case in sys.argv[1].split(","):
        CASES[case](hvd.rank(), hvd.size())
        print(f"ok {case}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
