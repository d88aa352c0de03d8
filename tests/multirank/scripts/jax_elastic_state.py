"""hvd.elastic for JAX on a fixed world: JaxState syncs, commits and restores parameters and an
optax state (pytrees) and plain attributes. Prints 'ok jax elastic state'.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

import hvdlite.jax as hvd


def init_params(rank):
    k1, k2 = jax.random.split(jax.random.key(rank))  # every rank starts different
    return {"w": jax.random.normal(k1, (3, 4)), "b": jnp.zeros(4), "out": jax.random.normal(k2, (4, 1))}


def loss_fn(params, x, y):
    return jnp.mean((jnp.tanh(x @ params["w"] + params["b"]) @ params["out"] - y) ** 2)


def host(state):
    return [np.asarray(leaf) for leaf in jax.tree.leaves((state.params, state.opt_state))]


def same_on_every_rank(state):
    every = hvd.allgather_object([leaf.tolist() for leaf in host(state)])
    return all(e == every[0] for e in every)


def equal(got, want):
    return len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def main():
    hvd.init()
    rank = hvd.rank()
    tx = hvd.DistributedOptimizer(optax.adam(0.05))
    params = init_params(rank)
    state = hvd.elastic.JaxState(params, tx.init(params), step=0)

    @jax.jit
    def train_step(params, opt_state, x, y):
        updates, opt_state = tx.update(jax.grad(loss_fn)(params, x, y), opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    assert not same_on_every_rank(state)
    state.sync()
    assert same_on_every_rank(state), "sync() must give every rank rank 0's parameters and optimizer state"
    rng = np.random.default_rng(rank)
    for step in range(3):
        x = rng.normal(size=(4, 3)).astype(np.float32)
        state.params, state.opt_state = train_step(state.params, state.opt_state, x, x.sum(1, keepdims=True))
        state.step = step + 1
    assert same_on_every_rank(state), "the DistributedOptimizer keeps the ranks in step"
    state.commit()
    committed = host(state)
    state.params, state.opt_state = train_step(state.params, state.opt_state, x * 2, x[:, :1])
    state.params = jax.tree.map(lambda leaf: leaf + rank, state.params)
    state.step = 99
    state.restore()
    assert equal(host(state), committed) and state.step == 3, "restore() must bring back the commit exactly"
    assert isinstance(state.params["w"], jax.Array)
    state.step = rank  # not committed: a sync takes rank 0's commit
    if rank == 0:
        state.params = {**state.params, "b": jnp.full(4, 42.0)}
    state.sync()
    assert same_on_every_rank(state) and np.all(np.asarray(state.params["b"]) == 42.0)
    assert state.step == 3
    synced = host(state)
    state.params, state.opt_state = train_step(state.params, state.opt_state, x, x[:, :1])  # runs after a sync
    state.restore()
    assert equal(host(state), synced), "a sync is saved: restore() brings back the synced values"
    state.check_host_updates()  # nothing changed: no HostsUpdatedInterrupt
    hvd.shutdown()
    print("ok jax elastic state", flush=True)


if __name__ == "__main__":
    main()
