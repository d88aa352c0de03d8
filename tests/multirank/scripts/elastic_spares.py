"""Warm spares (``hvdliterun --warm-spares 1``): a spare rank 0 started ahead fills a slot at a commit.

Usage: elastic_spares.py join HOSTS_FILE | refill | orphan | crash FLAG_FILE. ``join``: np=2 under ``--host-discovery-script
"cat HOSTS_FILE"``; once rank 0's spare is ready, rank 0 adds a slot (``localhost:3``) and the spare
fills it. ``refill``: np=3 with a short blacklist cooldown; world rank 2 SIGKILLs itself, the two
survivors re-form, and after the cooldown the spare fills the freed slot. ``orphan``: as ``refill`` but
rank 0 dies: its spare ends, and the job grows back to three ranks after the cooldown.
``crash``: np=2, the first spare exits
with status 3 before ``hvd.init()`` (it creates FLAG_FILE); the job trains on without spares.
Every rank checks by collectives that it holds the same world as the others; a process that joined
as a spare prints ``spare joined``; at the end rank 0 replays the committed steps alone and prints
``ok elastic spares MODE``.
"""

import os
import signal
import sys
import time

import numpy as np
from elastic_sgd import assert_replayed, check_world, sgd_step

import hvdlite as hvd
from hvdlite.elastic import spares

MODE = sys.argv[1]
STEPS_AT_FULL_SIZE = 6
SPARE = bool(os.environ.get("HVDLITE_ELASTIC_SPARE_OF"))


def change_the_world(state: hvd.elastic.ObjectState, full_size: int) -> None:
    """Once rank 0's spare is ready (every rank learns it by a broadcast): add a slot or kill a rank."""
    ready = sum(spares.mine().count(ready=True).values()) if hvd.rank() == 0 else 0
    if not hvd.broadcast_object(ready, root_rank=0, name="spare.ready"):
        return
    state.changed = True
    state.commit()
    if MODE == "join":
        if hvd.rank() == 0:
            with open(sys.argv[2] + ".tmp", "w") as handle:
                handle.write("localhost:3\n")
            os.replace(sys.argv[2] + ".tmp", sys.argv[2])
        return
    victim = 0 if MODE == "orphan" else full_size - 1
    if hvd.rank() == victim:
        os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    if SPARE and MODE == "crash" and not os.path.exists(sys.argv[2]):
        open(sys.argv[2], "w").close()
        sys.exit(3)
    hvd.init()
    if SPARE:
        print(f"spare joined as rank {hvd.rank()} of {hvd.size()}", flush=True)
    target = 3
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, w=np.zeros(3), step=0, changed=False,
                                    full_steps=0)
    seen = {"size": None}  # this process's: a joined rank runs no reset callback, so the loop checks

    @hvd.elastic.run
    def train(state):
        while (state.full_steps < STEPS_AT_FULL_SIZE or not state.changed) and not (MODE == "crash" and state.step >= 100):
            if seen["size"] != hvd.size():
                check_world()
                seen["size"] = hvd.size()
            if not state.changed and state.step >= 2 and MODE != "crash":
                change_the_world(state, hvd.size())
            sgd_step(state)
            state.full_steps += int(state.changed and hvd.size() == target)
            state.commit()
            time.sleep(0.02)

    train(state)
    if hvd.rank() == 0:
        assert_replayed(state.w, state.step)
        print(f"ok elastic spares {MODE} {state.step} steps", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
