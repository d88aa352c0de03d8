"""DiLoCo for optax with real ranks: every rank's parameters after every step against a one-process replay.

Usage: jax_diloco.py GROUP_SIZE jit|eager RUN,... Ranks form groups of GROUP_SIZE consecutive ranks;
inside a group a DistributedOptimizer over the group's set (SGD with momentum) keeps them alike;
across groups DiLoCo averages pseudo-gradients over the ranks holding the same place in each group
and steps a Nesterov outer SGD (lr 0.7, momentum 0.9). RUN is ``refusals`` or
``FRAGMENTS/DELAY[/COMPRESSION]``. Rank r's batch is x = r + 1 + step / 10.

The replay keeps one model per group, one global model and one outer state per fragment; fragment p
is sent after steps (p + 1) * H / F + k * H and lands DELAY steps later as ``new global + local
progress since it was sent``; with int8 / bf16 each group's pseudo-gradient is rounded by the
library's NumPy codec (error feedback per group and parameter). Each run also saves its DiLoCo
state at step CHECKPOINT_AT (with an exchange in flight when DELAY > 0), resumes a fresh
transformation from it and must end the same. Prints 'ok jax diloco RUN RANK' per run.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from diloco_common import ReplaySchedule, expect_refusal, parse_run, rounded, run_checks  # noqa: E402

import hvdlite.jax as hvd  # noqa: E402
from hvdlite.training.diloco import DiLoCoSchedule, split_fragments  # noqa: E402

SYNC_EVERY, STEPS, CHECKPOINT_AT = 4, 13, 6


def initial():
    return {"l1": {"w": jnp.linspace(-0.5, 0.5, 24).reshape(4, 6), "b": jnp.zeros((6,))},
            "l2": {"w": jnp.linspace(0.3, -0.3, 6).reshape(6, 1), "b": jnp.full((1,), 0.1)}}


def loss_fn(params, rank, step):
    x = jnp.linspace(-1, 1, 8).reshape(2, 4) * (rank + 1 + step / 10)
    hidden = jnp.tanh(x @ params["l1"]["w"] + params["l1"]["b"])
    return jnp.mean((hidden @ params["l2"]["w"] + params["l2"]["b"] - rank % 3) ** 2)


def inner_tx():
    return optax.sgd(0.05, momentum=0.5)


def outer_tx():
    return optax.sgd(0.7, momentum=0.9, nesterov=True)


class Replay(ReplaySchedule):
    """Every group's parameters after every step, with DiLoCo's outer steps, in this process."""

    def __init__(self, size, group_size, fragments, delay, compression):
        self.groups = [list(range(g, g + group_size)) for g in range(0, size, group_size)]
        self.params = [initial() for _ in self.groups]
        self.inner = [inner_tx().init(p) for p in self.params]
        self.global_leaves, self.treedef = jax.tree.flatten(initial())
        self.schedule = DiLoCoSchedule(SYNC_EVERY, fragments, delay)
        self.fragments = split_fragments([leaf.size for leaf in self.global_leaves], fragments)
        self.outer = [outer_tx().init([self.global_leaves[i] for i in part]) for part in self.fragments]
        self.compression, self.residuals, self.flight = compression, {}, None

    def step(self, step):
        for g, ranks in enumerate(self.groups):
            grads = [jax.grad(loss_fn)(self.params[g], rank, step) for rank in ranks]
            mean = jax.tree.map(lambda *v: sum(v) / len(v), *grads)
            updates, self.inner[g] = inner_tx().update(mean, self.inner[g], self.params[g])
            self.params[g] = optax.apply_updates(self.params[g], updates)
        self.after_step(step)

    def send(self, fragment):
        part = self.fragments[fragment]
        locals_ = [jax.tree.leaves(p) for p in self.params]
        deltas = [[rounded(self.compression, self.residuals, (g, i), np.asarray(self.global_leaves[i] - leaves[i]))
                   for i in part] for g, leaves in enumerate(locals_)]
        average = [sum(d[k] for d in deltas) / len(deltas) for k in range(len(part))]
        anchors = [[leaves[i] for i in part] for leaves in locals_]
        self.flight = (fragment, average, anchors)

    def land(self):
        fragment, average, anchors = self.flight
        part = self.fragments[fragment]
        start = [self.global_leaves[i] for i in part]
        updates, self.outer[fragment] = outer_tx().update([jnp.asarray(a) for a in average], self.outer[fragment],
                                                          start)
        stepped = optax.apply_updates(start, updates)
        for i, value in zip(part, stepped, strict=True):
            self.global_leaves[i] = value
        for g, anchor in enumerate(anchors):
            leaves = jax.tree.leaves(self.params[g])
            for k, i in enumerate(part):
                leaves[i] = stepped[k] + (leaves[i] - anchor[k])
            self.params[g] = jax.tree.unflatten(self.treedef, leaves)

    def flat(self, group):
        return flat(self.params[group])


def flat(params):
    return np.concatenate([np.ravel(v) for v in jax.tree.leaves(params)])


def check_refusals(group_size, sets):
    """What DiLoCo cannot run is a ValueError on every rank, naming what is wrong."""
    rank, size = hvd.rank(), hvd.size()
    every = 4 if rank == 0 else 8  # rank 0 disagrees with every other rank
    expect_refusal(f"the schedule (sync_every, fragments, delay) differs across the process set {list(range(size))}: "
                   "rank 0 has (4, 1, 0), rank 1 has (8, 1, 0)",
                   lambda: hvd.DiLoCo(inner_tx(), outer_tx(), sync_every=every).init(initial()))
    others = sets["group"][(rank // group_size + 1) % len(sets["group"])]
    expect_refusal(f"this rank is not in DiLoCo's process_set {others.ranks}",
                   lambda: hvd.DiLoCo(inner_tx(), outer_tx(), sync_every=4, process_set=others))
    expect_refusal("DiLoCo's compression must be None, 'bf16' or 'int8', got 'int4'",
                   lambda: hvd.DiLoCo(inner_tx(), outer_tx(), sync_every=4, compression="int4"))
    expect_refusal("delay=2 must be smaller than sync_every / fragments = 2",
                   lambda: hvd.DiLoCo(inner_tx(), outer_tx(), sync_every=4, fragments=2, delay=2))
    tx = hvd.DiLoCo(inner_tx(), outer_tx(), sync_every=4)
    expect_refusal("DiLoCo.regroup needs the parameters' names: call it after init or an update",
                   lambda: tx.regroup(hvd.global_process_set))
    state = tx.init(initial())
    expect_refusal(f"this rank is not in DiLoCo's process_set {others.ranks}", lambda: tx.regroup(others))
    saved = tx.state_dict(state)
    expect_refusal("DiLoCo checkpoint was saved with another schedule: sync_every=4 there, 8 here",
                   lambda: (other := hvd.DiLoCo(inner_tx(), outer_tx(), sync_every=8)).load_state_dict(
                       other.init(initial()), saved))
    print(f"ok jax diloco refusals {rank}", flush=True)


def build(group_set, cross_set, fragments, delay, compression):
    inner = hvd.DistributedOptimizer(inner_tx(), process_set=group_set, name="inner")
    return hvd.DiLoCo(inner, outer_tx(), sync_every=SYNC_EVERY, process_set=cross_set, fragments=fragments,
                      delay=delay, compression=compression)


def check(run, group_size, mode, sets):
    if run == "refusals":
        return check_refusals(group_size, sets)
    rank, size = hvd.rank(), hvd.size()
    fragments, delay, compression, group_set, cross_set = parse_run(run, rank, group_size, sets)
    tx = build(group_set, cross_set, fragments, delay, compression)

    def make_step(tx):
        def step(params, state, at):
            grads = jax.grad(loss_fn)(params, rank, at)
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state
        return jax.jit(step) if mode == "jit" else step

    params, replay, step = initial(), Replay(size, group_size, fragments, delay, compression), make_step(tx)
    state = tx.init(params)
    for at in range(STEPS):
        if at == CHECKPOINT_AT:
            saved = (tx.state_dict(state), params, state.inner)
        params, state = step(params, state, at)
        replay.step(at)
        mine, want = flat(params), replay.flat(rank // group_size)
        assert np.allclose(mine, want, atol=1e-5), (run, rank, at, np.abs(mine - want).max())
    lands = len([c for c in range(1, STEPS + 1) if replay.schedule.lands_after(c) is not None])
    assert int(state.syncs) == lands, (run, int(state.syncs), lands)
    resumed = build(group_set, cross_set, fragments, delay, compression)
    again, resumed_step = saved[1], make_step(resumed)
    resumed_state = resumed.load_state_dict(resumed.init(again)._replace(inner=saved[2]), saved[0])
    for at in range(CHECKPOINT_AT, STEPS):
        again, resumed_state = resumed_step(again, resumed_state, at)
    assert np.allclose(flat(again), flat(params), atol=1e-6), (run, rank, "resumed", np.abs(flat(again) - flat(params)).max())
    print(f"ok jax diloco {run} {rank}", flush=True)


def main():
    run_checks(hvd, check)


if __name__ == "__main__":
    main()
