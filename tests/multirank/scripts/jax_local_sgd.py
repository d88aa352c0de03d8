"""Local SGD for optax with real ranks: each rank's parameters against a replay of every rank in one process.

Usage: jax_local_sgd.py sgd|adam jit|eager [sets]. Rank r fits a linear model to its own data (x = r + 1)
for STEPS updates with ``local_sgd_period=PERIOD, local_sgd_warmup_steps=WARMUP``; the replay runs
one optax state per rank (gradients averaged during the warm-up, local afterwards; parameters, and
with Adam its state, averaged every PERIOD local steps). With ``sets`` the even and the odd ranks
are two process sets, each averaging inside itself, and each step is two micro-batches
(``backward_passes_per_step=2``, x = r + 1 and r + 2, their mean). Prints 'ok jax local sgd <rank>'.
"""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import hvdlite.jax as hvd  # noqa: E402

STEPS, PERIOD, WARMUP = 9, 3, 2


def base_tx(kind: str) -> optax.GradientTransformation:
    return optax.adam(0.05) if kind == "adam" else optax.sgd(0.05, momentum=0.5)


def loss_fn(params, rank, micro_batch=0):
    x = jnp.full((2, 4), rank + 1.0 + micro_batch)
    return jnp.mean((x @ params["w"] + params["b"] - rank) ** 2)


def initial():
    return {"w": jnp.linspace(-0.5, 0.5, 4).reshape(4, 1), "b": jnp.zeros((1,))}


def sets_for(size: int, split: bool) -> list[list[int]]:
    """The ranks that average together: the even and the odd ones, or everyone."""
    return [list(range(0, size, 2)), list(range(1, size, 2))] if split else [list(range(size))]


def _mean(trees: list) -> list:
    """The leafwise mean of ``trees`` (floating leaves; others from the first), once per tree."""
    mean = jax.tree.map(lambda *v: sum(v) / len(v) if jnp.issubdtype(v[0].dtype, jnp.floating) else v[0], *trees)
    return [mean] * len(trees)


def replay(kind: str, size: int, split: bool = False) -> list[list[np.ndarray]]:
    """Every rank's flattened parameters after each step, simulated here."""
    tx = base_tx(kind)
    params = [initial() for _ in range(size)]
    states = [tx.init(p) for p in params]
    micro_batches = 2 if split else 1
    history = []
    for step in range(STEPS):
        grads = [_mean([jax.grad(loss_fn)(p, r, m) for m in range(micro_batches)])[0] for r, p in enumerate(params)]
        for ranks in sets_for(size, split):
            if step < WARMUP:
                for r, mean in zip(ranks, _mean([grads[r] for r in ranks]), strict=True):
                    grads[r] = mean
        for r in range(size):
            updates, states[r] = tx.update(grads[r], states[r], params[r])
            params[r] = optax.apply_updates(params[r], updates)
        local = step + 1 - WARMUP
        for ranks in sets_for(size, split):
            if local > 0 and local % PERIOD == 0:
                for r, mean in zip(ranks, _mean([params[r] for r in ranks]), strict=True):
                    params[r] = mean
                if kind == "adam":
                    for r, mean in zip(ranks, _mean([states[r] for r in ranks]), strict=True):
                        states[r] = mean
        history.append([np.concatenate([np.ravel(v) for v in jax.tree.leaves(p)]) for p in params])
    return history


def main() -> None:
    from mpi4py import MPI

    kind, mode, split = sys.argv[1], sys.argv[2], sys.argv[3:] == ["sets"]
    sets = [hvd.ProcessSet(ranks) for ranks in sets_for(MPI.COMM_WORLD.Get_size(), split)] if split else []
    hvd.init(process_sets=sets)
    rank, size = hvd.rank(), hvd.size()
    mine_set = next(s for s in sets if s.included()) if split else hvd.global_process_set
    micro_batches = 2 if split else 1
    tx = hvd.DistributedOptimizer(base_tx(kind), local_sgd_period=PERIOD, local_sgd_warmup_steps=WARMUP,
                                  local_sgd_average_state=kind == "adam", process_set=mine_set,
                                  backward_passes_per_step=micro_batches)
    params = initial()
    state = tx.init(params)

    def step(params, state, micro_batch):
        grads = jax.grad(loss_fn)(params, rank, micro_batch)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    step = jax.jit(step) if mode == "jit" else step
    expected = replay(kind, size, split)
    for at in range(STEPS):
        for micro_batch in range(micro_batches):  # the updates are zeros until the last micro-batch
            params, state = step(params, state, micro_batch)
        mine = np.concatenate([np.ravel(v) for v in jax.tree.leaves(params)])
        assert np.allclose(mine, expected[at][rank], atol=1e-5), (rank, at, mine, expected[at][rank])
        every = hvd.allgather_object(mine.tolist(), process_set=mine_set)
        local = at + 1 - WARMUP
        # Together during the warm-up and after an average (p + (mean - p) may round differently per
        # rank, hence the tolerance); apart in between.
        together = all(np.allclose(e, every[0], atol=1e-6) for e in every)
        assert together == (local <= 0 or local % PERIOD == 0 or len(every) == 1), (rank, at, every)
    print(f"ok jax local sgd {' '.join(sys.argv[1:])} {rank}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
