"""Elastic world changes at commits: the job grows into new slots, refills a dead rank's slot after its
host's cooldown, or lets a rank go whose slot left the host list.

Usage: elastic_hosts.py grow|refill|leave|cut HOSTS_FILE TARGET_SIZE [NEW_HOSTS]. The discovery script (if any) prints
HOSTS_FILE. ``grow``: rank 0 writes one more slot into it at step 3 (or NEW_HOSTS, e.g. hostA:2,hostB:1). ``refill``: rank 2 of 3 is
SIGKILLed at step 3. ``leave``: rank 0 writes one slot less at step 3. ``cut``: nothing here (the test cuts a host's link).
Steps are paced at 50 ms. Every rank trains until the job
has had TARGET_SIZE ranks for 3 steps, then checks the weights against the sizes the committed steps
ran at (nothing lost or applied twice) and prints 'ok elastic hosts <rank> <size>'.
"""

import os
import signal
import socket
import sys
import time

import torch

import hvdlite.torch as hvd

MODE, HOSTS_FILE, TARGET = sys.argv[1], sys.argv[2], int(sys.argv[3])
NEW_HOSTS = sys.argv[4].replace(",", "\n") if len(sys.argv) > 4 else ""
MAX_STEPS, CHANGE_AT = 400, 3


def main() -> None:
    torch.set_num_threads(1)
    hvd.init()
    launch_rank, first_size = hvd.rank(), hvd.size()
    print(f"started as rank {hvd.rank()} of {hvd.size()} on {socket.gethostname()}", flush=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    initial = model.weight.detach().clone()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    # sizes: the world size each committed step ran at; at_target: committed steps at TARGET ranks after a change;
    # changed: the world has changed.
    state = hvd.elastic.TorchState(model, optimizer, step=0, sizes=[], at_target=0, changed=False)
    resets = []

    def on_reset():
        resets.append(hvd.size())
        state.changed = True  # committed (the state is the last commit here), so the sync carries it to new ranks
        state.save()

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        for step in range(state.step, MAX_STEPS):
            if state.at_target >= 3:
                return
            change_world(step, launch_rank, first_size)
            optimizer.zero_grad()
            model(torch.full((2, 4), float(hvd.rank() + 1))).sum().backward()
            optimizer.step()
            state.sizes = state.sizes + [hvd.size()]
            # Only steps after the world changed count (a refilled job starts at its target size too).
            state.at_target += hvd.size() == TARGET and state.changed
            state.step = step + 1
            state.commit()
            time.sleep(0.05)  # paced, so that a cooldown or the launcher's 1 s poll ends within the run
        raise AssertionError(f"the job never had {TARGET} ranks for 3 steps (sizes {state.sizes})")

    train(state)
    # The weight's gradient is 2 * x per step, averaged over ranks x = 1..size: 2 * (size + 1) / 2.
    expected = initial - 0.01 * sum(size + 1.0 for size in state.sizes)
    assert torch.allclose(model.weight, expected, atol=1e-4), (model.weight, expected, state.sizes)
    weights = hvd.allgather_object(model.weight.detach().tolist())
    assert all(w == weights[0] for w in weights), weights
    print(f"resets {resets} sizes {sorted(set(state.sizes))}", flush=True)
    print(f"ok elastic hosts {hvd.rank()} {hvd.size()}", flush=True)
    hvd.shutdown()


def change_world(step: int, launch_rank: int, first_size: int) -> None:
    """The failure or host-list change of this MODE, once, at step CHANGE_AT of the first world."""
    if step != CHANGE_AT or hvd.size() != first_size or os.environ.get("HVDLITE_ELASTIC_SPAWN_PREFIX"):
        return
    if MODE == "refill" and launch_rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    if MODE in ("grow", "leave") and hvd.rank() == 0:
        slots = first_size + (1 if MODE == "grow" else -1)
        with open(HOSTS_FILE + ".tmp", "w") as handle:
            handle.write(f"{NEW_HOSTS or f'localhost:{slots}'}\n")
        os.replace(HOSTS_FILE + ".tmp", HOSTS_FILE)


if __name__ == "__main__":
    main()
