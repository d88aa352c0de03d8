"""JAX and optax with process sets: evens, odds (disjoint) and a third set overlapping both.

Usage: jax_process_sets.py static|dynamic (``hvd.init(process_sets=[...])``, or
``init(process_sets="dynamic")`` + ``add_process_set``, then removal and registration again). Every
collective runs on each set this rank is in, outside ``jax.jit`` and inside it; on each set it is
not in, every collective fails with the core's ProcessSetError at once (inside jit: when traced),
and ``DistributedOptimizer`` stays local. Evens and odds each train a model with
``DistributedOptimizer(process_set=...)`` (eager, jit, and accumulating two micro-batches in jit),
which must equal one process training on the whole of its set's batch. Prints
'caught ProcessSetError <eager|jit> <collective>: <message>' per refused call and
'ok jax process sets <mode>' at the end.
"""

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from checks import expect_error

import hvdlite.api
import hvdlite.jax as hvd

STEPS, PER_RANK, FEATURES, HIDDEN = 4, 4, 5, 8


def sets_for(size):
    """Evens and odds (disjoint), and a set overlapping both.

    np=3: [0, 2], [1], [0, 1]; np=4: [0, 2], [1, 3], [0, 1, 2].
    """
    return [list(range(0, size, 2)), list(range(1, size, 2)), [0, 1] if size == 3 else [0, 1, 2]]


def call(fn, jit, *args):
    return jax.jit(fn)(*args) if jit else fn(*args)


def check_reductions(ps, rank, jit):
    members, n = ps.ranks, ps.size()
    tree = {"a": jnp.full((2,), rank + 1.0), "b": [jnp.arange(3) + rank]}
    out = call(lambda t: hvd.allreduce(t, op=hvd.Sum, process_set=ps), jit, tree)  # unnamed: named per set
    assert out["a"].tolist() == [sum(r + 1.0 for r in members)] * 2, out
    assert out["b"][0].tolist() == [n * i + sum(members) for i in range(3)], out
    big_allreduce = lambda x: hvd.allreduce(x, name="ps.big", process_set=ps)  # noqa: E731
    big_allreduce = jax.jit(big_allreduce) if jit else big_allreduce  # one compile, run twice on the same buffers
    for step in range(2):  # large (shared memory; in jit into reused buffers), twice: results must not alias
        big = big_allreduce(jnp.full(70000, rank + step, jnp.float32))
        assert np.allclose(big, np.mean([r + step for r in members])), (step, big[:3])
    most, ones = call(lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Max, process_set=ps), jit,
                      jnp.ones(2) * rank, jnp.ones(3))
    assert most.tolist() == [max(members)] * 2 and ones.tolist() == [1.0] * 3, (most, ones)
    rows = jnp.arange(2 * n + 1, dtype=jnp.float32)[:, None] + rank  # uneven: the set's first member gets 3 rows
    counts = [3] + [2] * (n - 1)
    start = sum(counts[: ps.rank()])
    want = (np.arange(start, start + counts[ps.rank()]) * n + sum(members))[:, None]
    block = call(lambda x: hvd.reducescatter(x, op=hvd.Sum, process_set=ps), jit, rows)
    assert block.shape == want.shape and np.allclose(block, want), (block, want)
    first, second = call(lambda x: hvd.grouped_reducescatter([x, 2 * x], op=hvd.Sum, process_set=ps), jit, rows)
    assert np.allclose(first, want) and np.allclose(second, 2 * want), (first, second)


def check_movements(ps, rank, jit):
    members, n, me = ps.ranks, ps.size(), ps.rank()
    gathered = call(lambda x: hvd.allgather(x, process_set=ps), jit, jnp.full((2, 2), rank, jnp.int32))
    assert gathered.shape == (2 * n, 2) and gathered[:, 0].tolist() == [r for r in members for _ in range(2)], gathered
    rows, flat = call(lambda a, b: hvd.grouped_allgather([a, b], process_set=ps), jit,
                      jnp.full((1, 2), float(rank)), jnp.ones(3))
    assert rows[:, 0].tolist() == [float(r) for r in members] and flat.shape == (3 * n,), (rows, flat)
    root = members[-1]
    tree = {"w": jnp.full(3, float(rank)), "i": jnp.array([rank, 7])}
    value = call(lambda t: hvd.broadcast(t, root_rank=root, process_set=ps), jit, tree)
    assert value["w"].tolist() == [float(root)] * 3 and value["i"].tolist() == [root, 7], value
    sent = jnp.arange(2 * n, dtype=jnp.float32) + 100 * rank
    received = call(lambda x: hvd.alltoall(x, name="ps.a2a", process_set=ps), jit, sent)
    assert received.tolist() == [100.0 * r + 2 * me + k for r in members for k in range(2)], received


def check_host_only(ps, rank):
    """What runs outside jit only: uneven allgather, alltoall with splits, barrier, join, objects, state."""
    members, n, me = ps.ranks, ps.size(), ps.rank()
    uneven = hvd.allgather(jnp.full((rank + 1, 2), rank), process_set=ps)
    assert uneven[:, 0].tolist() == [r for r in members for _ in range(r + 1)], uneven
    data, got = hvd.alltoall(jnp.full((n + 1, 1), float(rank)), splits=[2] + [1] * (n - 1), process_set=ps)
    assert data[:, 0].tolist() == [float(r) for r in members for _ in range(2 if me == 0 else 1)], data
    assert got.tolist() == [2 if me == 0 else 1] * n, got
    hvd.barrier(process_set=ps)
    root = members[-1]
    assert hvd.broadcast_object({"from": rank}, root_rank=root, process_set=ps) == {"from": root}
    assert hvd.allgather_object(rank, process_set=ps) == members
    params = {"w": jnp.full((3, 2), float(rank)), "step": rank, "tag": f"r{rank}"}
    params = hvd.broadcast_parameters(params, root_rank=root, process_set=ps)
    assert np.allclose(params["w"], root) and (params["step"], params["tag"]) == (root, f"r{root}"), params
    tx = optax.adam(0.1)
    _, state = tx.update({"w": jnp.full(3, rank + 1.0)}, tx.init({"w": jnp.ones(3)}))  # moments differ per rank
    state = hvd.broadcast_optimizer_state(state, root_rank=root, process_set=ps)
    assert np.allclose(state[0].mu["w"], 0.1 * (root + 1)), state[0].mu
    last = hvd.join(process_set=ps)  # which member joins last depends on timing; every member hears the same one
    assert last in members and hvd.allgather_object(last, process_set=ps) == [last] * n, last


OUTSIDE = {
    "allreduce": lambda ps: lambda x: hvd.allreduce(x, process_set=ps),
    "grouped_allreduce": lambda ps: lambda x: hvd.grouped_allreduce([x, x], process_set=ps),
    "allgather": lambda ps: lambda x: hvd.allgather(x, process_set=ps),
    "grouped_allgather": lambda ps: lambda x: hvd.grouped_allgather([x, x], process_set=ps),
    "broadcast": lambda ps: lambda x: hvd.broadcast(x, root_rank=ps.ranks[0], process_set=ps),
    "alltoall": lambda ps: lambda x: hvd.alltoall(x, process_set=ps),
    "reducescatter": lambda ps: lambda x: hvd.reducescatter(x, process_set=ps),
    "grouped_reducescatter": lambda ps: lambda x: hvd.grouped_reducescatter([x, x], process_set=ps),
}
HOST_OUTSIDE = {
    "alltoall_splits": lambda ps, x: hvd.alltoall(x, splits=[1] * len(ps.ranks), process_set=ps),
    "barrier": lambda ps, x: hvd.barrier(process_set=ps),
    "join": lambda ps, x: hvd.join(process_set=ps),
    "broadcast_parameters": lambda ps, x: hvd.broadcast_parameters({"x": x}, ps.ranks[0], process_set=ps),
    "broadcast_optimizer_state": lambda ps, x: hvd.broadcast_optimizer_state((x,), ps.ranks[0], process_set=ps),
    "broadcast_object": lambda ps, x: hvd.broadcast_object(1, ps.ranks[0], process_set=ps),
    "allgather_object": lambda ps, x: hvd.allgather_object(1, process_set=ps),
}


class CountingAllreduces:
    """Counts the core's allreduce calls (single and grouped) while it is open."""

    def __init__(self):
        self.calls, self._real = 0, (hvdlite.api.allreduce_async, hvdlite.api.grouped_allreduce_async)
        hvdlite.api.allreduce_async, hvdlite.api.grouped_allreduce_async = self._counted(0), self._counted(1)

    def _counted(self, index):
        def counted(*args, **kwargs):
            self.calls += 1
            return self._real[index](*args, **kwargs)
        return counted

    def close(self):
        hvdlite.api.allreduce_async, hvdlite.api.grouped_allreduce_async = self._real


def check_outside(ps, rank):
    """Every call on a set this rank is not in fails at once; its optimizer stays local."""
    want = f"rank {rank} is not in process set {ps.process_set_id} {ps.ranks}"
    x = jnp.ones((4, 2))
    for jit in (False, True):
        for kind, make in OUTSIDE.items():
            # in jit the error comes while tracing: a ProcessSetError itself, not a JaxRuntimeError from a callback
            exc = expect_error(hvd.ProcessSetError, want, lambda make=make, jit=jit: call(make(ps), jit, x), kind)
            print(f"caught ProcessSetError {'jit' if jit else 'eager'} {kind}: {exc}", flush=True)
    for kind, fn in HOST_OUTSIDE.items():
        exc = expect_error(hvd.ProcessSetError, want, lambda fn=fn: fn(ps, x), kind)
        print(f"caught ProcessSetError eager {kind}: {exc}", flush=True)
    counter = CountingAllreduces()
    tx = hvd.DistributedOptimizer(optax.sgd(1.0), process_set=ps)
    grads = {"w": jnp.arange(3.0) + rank}
    for update in (tx.update, jax.jit(tx.update)):
        updates, _ = update(grads, tx.init(grads))
        assert updates["w"].tolist() == (-grads["w"]).tolist(), updates
    counter.close()
    assert counter.calls == 0, f"an optimizer on a set this rank is not in communicated {counter.calls} times"


# ---- two data-parallel groups ----------------------------------------------------------------------
@functools.cache  # JAX arrays are immutable: both modes and the reference share one draw per seed
def init_params(seed):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return {"w1": jax.random.normal(k1, (FEATURES, HIDDEN)) * 0.5, "b1": jnp.zeros(HIDDEN),
            "w2": jax.random.normal(k2, (HIDDEN, 1)) * 0.5, "b2": jnp.zeros(1)}


def loss_fn(params, x, y):
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] + params["b2"] - y) ** 2)


def base_tx():
    return optax.chain(optax.clip_by_global_norm(0.5), optax.adam(0.05))


def train(tx, params, state, batches, jit):
    def step(params, state, x, y):
        updates, state = tx.update(jax.grad(loss_fn)(params, x, y), state, params)
        return optax.apply_updates(params, updates), state

    step = jax.jit(step) if jit else step
    for x, y in batches:
        params, state = step(params, state, x, y)
    return params


def set_data(first, n):
    rng = np.random.default_rng(first)  # each set its own data
    x = rng.normal(size=(STEPS, n * PER_RANK, FEATURES)).astype(np.float32)
    y = (x.sum(axis=-1, keepdims=True) * 0.5 + rng.normal(size=(STEPS, n * PER_RANK, 1))).astype(np.float32)
    return x, y


@functools.cache  # depends only on the set and passes, not on eager/jit or the mode: train it once per job
def reference_params(first, n, passes):
    """One process training on the set's whole batch (the same data and start every check uses)."""
    x, y = set_data(first, n)
    reference = base_tx() if passes == 1 else optax.MultiSteps(base_tx(), every_k_schedule=passes)
    start = init_params(first)
    return train(reference, start, reference.init(start), list(zip(x, y, strict=True)), jit=True)


def check_training(mine, rank, jit, passes):
    """Train on ``mine`` (ranks start different) and compare with one process on the set's whole batch."""
    n, me, first = mine.size(), mine.rank(), mine.ranks[0]
    x, y = set_data(first, n)
    shard = slice(me * PER_RANK, (me + 1) * PER_RANK)
    tx = hvd.DistributedOptimizer(base_tx(), backward_passes_per_step=passes, process_set=mine)
    params = hvd.broadcast_parameters(init_params(seed=rank), root_rank=first, process_set=mine)
    state = hvd.broadcast_optimizer_state(tx.init(params), root_rank=first, process_set=mine)
    got = train(tx, params, state, [(x[s, shard], y[s, shard]) for s in range(STEPS)], jit)
    want = reference_params(first, n, passes)
    diff = max(float(jnp.max(jnp.abs(got[k] - want[k]))) for k in want)
    assert diff < 2e-5, (jit, passes, diff)
    flat = np.concatenate([np.ravel(got[k]) for k in sorted(got)])
    everyone = hvd.allgather(flat[None, :], process_set=mine)
    assert (np.asarray(everyone) == flat).all(), "parameters differ within the set"
    # over the whole job: each set's members agree, and the two sets trained apart
    every = hvd.allgather_object((first, flat.tolist()))
    for other_first, other in every:
        assert (other == flat.tolist()) == (other_first == first), "the two groups' parameters mixed"


# ---- registration ----------------------------------------------------------------------------------
def check_sets(sets, rank):
    for ps in sets:  # the same order on every rank, so overlapping sets never wait on each other in a cycle
        if ps.included():
            for jit in (False, True):
                check_reductions(ps, rank, jit)
                check_movements(ps, rank, jit)
            check_host_only(ps, rank)
        else:
            check_outside(ps, rank)
    mine = sets[rank % 2]
    for jit, passes in ((False, 1), (True, 1), (True, 2)):
        check_training(mine, rank, jit, passes)


def static(rank, size):
    sets = [hvd.ProcessSet(ranks) for ranks in sets_for(size)]
    hvd.init(process_sets=sets)
    assert [ps.process_set_id for ps in sets] == [1, 2, 3]
    check_sets(sets, rank)


def dynamic(rank, size):
    hvd.init(process_sets="dynamic")
    evens, odds, extra = sets_for(size)
    sets = [hvd.add_process_set(hvd.ProcessSet(evens)), hvd.add_process_set(odds), hvd.add_process_set(extra)]
    assert [ps.process_set_id for ps in sets] == [1, 2, 3]
    check_sets(sets, rank)
    removed = sets[2]
    compiled = jax.jit(lambda v: hvd.allreduce(v, op=hvd.Sum, process_set=removed))
    if removed.included():
        assert compiled(jnp.ones(2)).tolist() == [len(extra)] * 2
    assert hvd.remove_process_set(removed)
    if rank in extra:  # compiled while registered: the collective is refused when it runs
        expect_error(jax.errors.JaxRuntimeError, "is not registered", lambda: compiled(jnp.ones(2)).block_until_ready(),
                     "compiled before removal")
    expect_error(hvd.ProcessSetError, "is not registered",
                 lambda: jax.jit(lambda v: hvd.allreduce(v, process_set=removed))(jnp.ones(2)), "traced after removal")
    expect_error(hvd.ProcessSetError, "is not registered",
                 lambda: hvd.DistributedOptimizer(optax.sgd(1.0), process_set=removed), "optimizer after removal")
    again = hvd.add_process_set(extra)  # the same ranks again: the freed id is reused
    assert again.process_set_id == 3
    if again.included():
        summed = jax.jit(lambda v: hvd.allreduce(v, op=hvd.Sum, process_set=again))(jnp.ones(2))
        assert summed.tolist() == [len(extra)] * 2, summed


def main():
    from mpi4py import MPI

    for mode in sys.argv[1].split(","):  # one job, init -> shutdown -> init between modes
        {"static": static, "dynamic": dynamic}[mode](MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())
        assert hvd.allreduce(jnp.ones(1), op=hvd.Sum).tolist() == [hvd.size()]  # the global set is untouched
        hvd.shutdown()
        print(f"ok jax process sets {mode}", flush=True)


if __name__ == "__main__":
    main()
