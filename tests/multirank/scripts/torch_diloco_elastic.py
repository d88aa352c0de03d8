"""Elastic DiLoCo: a whole group dies, the other trains on without a restart, and a group joins again.

Usage: torch_diloco_elastic.py GROUP_SIZE NP, run with ``hvdliterun -np NP --min-np ...
--blacklist-cooldown-range 0.5 1`` (the test: 2 4). Ranks form groups of GROUP_SIZE (a
DistributedOptimizer over the group's set inside, SGD with momentum); DiLoCo averages pseudo-gradients
over the ranks at the same place in each group every SYNC_EVERY steps (Nesterov outer SGD). Every rank
of the last group is SIGKILLed at step KILL_AT. The survivors fail at their next collective across
groups, restore their last commit, register the new world's sets in a reset callback
(``diloco.regroup``) and train on. After the host's cooldown new ranks fill the slots at a commit: they build
their DiLoCo over the new sets and receive, in the state's sync, rank 0's model, inner optimizer state,
global parameters, outer optimizer state and step count.

The state records the world size of each committed step. At the end every rank checks its parameters
against a replay in one process of the groups each committed step ran with (at a re-form every group
starts again from group 0, whose state the sync gives every rank), so a joiner that missed the global
parameters or the outer momentum fails.
Prints 'ok diloco elastic RANK SIZES'.
"""

import copy
import sys

import torch
from diloco_common import elastic_steps, note_reform, register_dynamic_sets
from torch_diloco import SYNC_EVERY, inner_of, inner_step, loss_of, make_model, outer_of, outer_step

import hvdlite.torch as hvd

GROUP_SIZE, FULL = int(sys.argv[1]), int(sys.argv[2])  # ranks per group, ranks in the job
STEPS_AFTER_JOIN = 2 * SYNC_EVERY + 1


def replay(sizes: list[int]) -> list[torch.nn.Module]:
    """Each group's model after the committed steps, run at ``sizes[step]`` ranks each."""
    models = [make_model() for _ in range(FULL // GROUP_SIZE)]
    inners = [inner_of(model.parameters()) for model in models]
    global_model = make_model()
    outer = outer_of(global_model.parameters())
    live = len(models)
    for step, size in enumerate(sizes):
        if size // GROUP_SIZE != live:  # a re-form: the sync gave every rank rank 0's state (group 0's)
            live = size // GROUP_SIZE
            for g in range(1, live):
                models[g] = copy.deepcopy(models[0])
                inners[g] = inner_of(models[g].parameters())
                inners[g].load_state_dict(copy.deepcopy(inners[0].state_dict()))
        for group in range(live):
            inner_step(models[group], inners[group], range(group * GROUP_SIZE, (group + 1) * GROUP_SIZE), step)
        if (step + 1) % SYNC_EVERY == 0:
            outer_step(global_model, outer, models[:live])
    return models


def main() -> None:
    torch.set_num_threads(1)
    hvd.init(process_sets="dynamic")
    group, place = register_dynamic_sets(hvd, GROUP_SIZE)
    model = make_model()
    inner = hvd.DistributedOptimizer(inner_of(model.parameters()), named_parameters=model.named_parameters(),
                                      process_set=group)
    diloco = hvd.DiLoCo(model, inner, outer_of(model.parameters()), sync_every=SYNC_EVERY, process_set=place)
    state = hvd.elastic.TorchState(model, diloco, step=0, sizes=[], shrunk=False, joined_steps=0)

    def regroup() -> None:
        diloco.regroup(*reversed(register_dynamic_sets(hvd, GROUP_SIZE)))
        note_reform(hvd, state, FULL)

    state.register_reset_callbacks([regroup])

    def one_step(step: int) -> None:
        diloco.zero_grad()
        loss_of(model, hvd.rank(), step).backward()
        diloco.step()

    elastic_steps(hvd, state, GROUP_SIZE, FULL, STEPS_AFTER_JOIN, one_step)
    assert state.shrunk and state.joined_steps >= STEPS_AFTER_JOIN and hvd.size() == FULL, (state.sizes, hvd.size())
    assert diloco.inner_steps == len(state.sizes), (diloco.inner_steps, state.sizes)
    expected = replay(state.sizes)[hvd.rank() // GROUP_SIZE]
    for (name, param), want in zip(model.named_parameters(), expected.parameters(), strict=True):
        assert torch.allclose(param, want, atol=1e-5), (hvd.rank(), name, param, want)
    print(f"ok diloco elastic {hvd.rank()} {sorted(set(state.sizes))}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
