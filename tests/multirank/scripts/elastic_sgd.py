"""What the elastic job scripts (elastic_agreement.py, elastic_spares.py) share: a linear model trained
by SGD on a batch drawn from the step number, each rank its rows, the world check after a change,
and rank 0's replay of the committed steps alone."""

import numpy as np

import hvdlite as hvd
from hvdlite.core import runtime

BATCH, LR = 12, 0.1


def batch(step: int) -> np.ndarray:
    return np.random.default_rng(step).standard_normal((BATCH, 3))


def sgd_step(state: hvd.elastic.ObjectState) -> None:
    """One step on this world: the gradient of this rank's rows, summed over the ranks."""
    rows = batch(state.step)[hvd.rank()::hvd.size()]
    gradient = hvd.allreduce(rows.sum(axis=0), op=hvd.Sum, name="gradient") / BATCH
    state.w, state.step = state.w - LR * gradient, state.step + 1


def check_world() -> None:
    """Every rank of this world holds the same world (its process ids), compared by two collectives on it."""
    ids = list(runtime.current().process_ids)
    every = hvd.allgather_object(ids, name="world.ids")
    assert all(other == ids for other in every), every
    assert hvd.broadcast_object(ids, root_rank=0, name="world.ids.root") == ids
    print(f"world ok {hvd.size()} {ids}", flush=True)


def assert_replayed(w: np.ndarray, steps: int) -> None:
    """``w`` equals ``steps`` of SGD on the whole batches, replayed alone."""
    replay = np.zeros(3)
    for step in range(steps):
        replay = replay - LR * batch(step).sum(axis=0) / BATCH
    np.testing.assert_allclose(w, replay, rtol=1e-12, atol=1e-12)
