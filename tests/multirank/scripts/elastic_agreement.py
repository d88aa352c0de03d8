"""Elastic agreement: two ranks of one host die milliseconds apart, over and over in one job.

Usage: elastic_agreement.py apart|during DELAY_MS[,DELAY_MS...] [A,B]. Run with ``hvdliterun -np N --min-np 2
--blacklist-cooldown-range 0.001 0.001`` (N >= 4). For each delay, once the world is back to N ranks:
rank 0 picks a moment; world rank A (default 1) SIGKILLs itself then, world rank B (default N - 1)
that many milliseconds later (``apart``), or after 150 ms plus the delay (``during``: it sleeps through the first death as
a rank in a long step would, so it dies while the others agree on the new world). The survivors
re-form; each checks by collectives on the new world that every rank holds the same world (its
process ids); the killed slots come back at a commit (spawned ranks), and the next delay runs. At
the end rank 0 replays the committed steps alone: the weights must equal the job's.
Prints ``world ok <size> <ids>`` per re-form and ``ok elastic agreement <reps>`` on rank 0.
"""

import os
import signal
import sys
import time

import numpy as np
from elastic_sgd import assert_replayed, check_world, sgd_step

import hvdlite as hvd

MODE = sys.argv[1]
DELAYS_MS = [float(delay) for delay in sys.argv[2].split(",")]
VICTIMS = [int(rank) for rank in sys.argv[3].split(",")] if len(sys.argv) > 3 else None
STEPS_BETWEEN = 3


def die_in_turn(state: hvd.elastic.ObjectState, full_size: int) -> None:
    """At a kill step: commit, agree on a moment, and the two victims die at it and ``delay`` later."""
    delay = DELAYS_MS[state.rep] / 1e3
    state.rep, state.next_kill = state.rep + 1, state.step + STEPS_BETWEEN
    state.commit()
    moment = hvd.broadcast_object(time.time() + 0.05, root_rank=0, name="kill.moment")
    first, second = VICTIMS or (1, full_size - 1)
    victims = {first: moment, second: moment + delay + (0.15 if MODE == "during" else 0.0)}
    if hvd.rank() in victims:
        time.sleep(max(0.0, victims[hvd.rank()] - time.time()))
        os.kill(os.getpid(), signal.SIGKILL)


def check_world_after_a_death(full_size: int) -> None:
    """After a death: every rank of the new world holds the same world (a join is left alone: the
    joining ranks do not run the reset callbacks)."""
    if hvd.size() < full_size:
        check_world()


def main() -> None:
    hvd.init()
    full_size = hvd.size()
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, w=np.zeros(3), step=0, rep=0, next_kill=2)
    state.register_reset_callbacks([lambda: check_world_after_a_death(full_size)])

    @hvd.elastic.run
    def train(state):
        while state.rep < len(DELAYS_MS) or hvd.size() < full_size or state.step < state.next_kill:
            if hvd.size() == full_size and state.step >= state.next_kill and state.rep < len(DELAYS_MS):
                die_in_turn(state, full_size)
            sgd_step(state)
            state.commit()
            time.sleep(0.01)

    train(state)
    if hvd.rank() == 0:
        assert_replayed(state.w, state.step)
        print(f"ok elastic agreement {state.rep} reps, {state.step} steps", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
