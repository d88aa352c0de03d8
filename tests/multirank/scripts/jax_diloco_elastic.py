"""Elastic DiLoCo for optax: a whole group dies, the other trains on without a restart, and a group joins.

Usage: jax_diloco_elastic.py GROUP_SIZE NP, run with ``hvdliterun -np NP --min-np ...
--blacklist-cooldown-range 0.5 1``. The story of torch_diloco_elastic.py with JAX: groups of
GROUP_SIZE ranks (a DistributedOptimizer over the group's set inside, SGD with momentum), DiLoCo's
pseudo-gradients averaged over the ranks at the same place in each group every SYNC_EVERY steps
(Nesterov outer SGD), the training step jitted. Every rank of the last group is SIGKILLed at step
KILL_AT. The survivors restore their last commit, and in a reset callback register the new world's
sets, move DiLoCo onto them (``tx.regroup(place, inner=...)``) and jit the step again. After the
host's cooldown new ranks fill the slots at a commit: they build their DiLoCo over the new sets and
receive rank 0's parameters and optax state (the inner state, the global parameters, the outer state
and the step count, all in the DiLoCoState) in JaxState's sync.

At the end every rank checks its parameters against a replay in one process of the groups each
committed step ran with (at a re-form every group starts again from group 0, whose state the sync
gives every rank). Prints 'ok jax diloco elastic RANK SIZES'.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import sys  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from diloco_common import elastic_steps, note_reform, register_dynamic_sets  # noqa: E402
from jax_diloco import SYNC_EVERY, flat, initial, inner_tx, loss_fn, outer_tx  # noqa: E402

import hvdlite.jax as hvd  # noqa: E402

GROUP_SIZE, FULL = int(sys.argv[1]), int(sys.argv[2])  # ranks per group, ranks in the job
STEPS_AFTER_JOIN = 2 * SYNC_EVERY + 1


def inner_and_place():
    """This world's inner transformation (averaging over the group) and DiLoCo's set."""
    group, place = register_dynamic_sets(hvd, GROUP_SIZE)
    return hvd.DistributedOptimizer(inner_tx(), process_set=group, name="inner"), place


def jitted_step(tx):
    """The training step, traced with ``tx``'s sets as they are now."""
    @jax.jit
    def step(params, opt_state, rank, at):
        updates, opt_state = tx.update(jax.grad(loss_fn)(params, rank, at), opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    return step


def replay(sizes):
    """Each group's parameters after the committed steps, run at ``sizes[step]`` ranks each."""
    params = [initial() for _ in range(FULL // GROUP_SIZE)]
    inner = [inner_tx().init(p) for p in params]
    global_leaves, treedef = jax.tree.flatten(initial())
    outer = outer_tx().init(global_leaves)
    live = len(params)
    for step, size in enumerate(sizes):
        if size // GROUP_SIZE != live:  # a re-form: the sync gave every rank rank 0's state (group 0's)
            live = size // GROUP_SIZE
            for g in range(1, live):
                params[g], inner[g] = params[0], inner[0]
        for g in range(live):
            grads = [jax.grad(loss_fn)(params[g], rank, step) for rank in range(g * GROUP_SIZE, (g + 1) * GROUP_SIZE)]
            updates, inner[g] = inner_tx().update(jax.tree.map(lambda *v: sum(v) / len(v), *grads), inner[g],
                                                  params[g])
            params[g] = optax.apply_updates(params[g], updates)
        if (step + 1) % SYNC_EVERY == 0:  # the outer step on the groups' mean pseudo-gradient
            deltas = [[g - mine for g, mine in zip(global_leaves, jax.tree.leaves(p), strict=True)]
                      for p in params[:live]]
            mean = [sum(column) / live for column in zip(*deltas, strict=True)]
            updates, outer = outer_tx().update(mean, outer, global_leaves)
            global_leaves = optax.apply_updates(global_leaves, updates)
            params = [jax.tree.unflatten(treedef, global_leaves) for _ in params]
    return params


def main():
    hvd.init(process_sets="dynamic")
    inner, place = inner_and_place()
    tx = hvd.DiLoCo(inner, outer_tx(), sync_every=SYNC_EVERY, process_set=place)
    params = initial()
    state = hvd.elastic.JaxState(params, tx.init(params), step=0, sizes=[], shrunk=False, joined_steps=0)
    train_step = [jitted_step(tx)]

    def regroup():
        inner, place = inner_and_place()
        tx.regroup(place, inner=inner)
        train_step[0] = jitted_step(tx)
        note_reform(hvd, state, FULL)

    state.register_reset_callbacks([regroup])

    def one_step(step):
        state.params, state.opt_state = train_step[0](state.params, state.opt_state, hvd.rank(), step)

    elastic_steps(hvd, state, GROUP_SIZE, FULL, STEPS_AFTER_JOIN, one_step)
    assert state.shrunk and state.joined_steps >= STEPS_AFTER_JOIN and hvd.size() == FULL, (state.sizes, hvd.size())
    assert int(state.opt_state.step) == len(state.sizes), (int(state.opt_state.step), state.sizes)
    expected = flat(replay(state.sizes)[hvd.rank() // GROUP_SIZE])
    np.testing.assert_allclose(flat(state.params), expected, atol=1e-5, err_msg=f"rank {hvd.rank()}")
    print(f"ok jax diloco elastic {hvd.rank()} {sorted(set(state.sizes))}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
