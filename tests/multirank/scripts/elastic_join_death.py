"""A rank dies while new ranks join: the others go on without it and without the newcomers.

Usage: elastic_join_death.py spawn|admit|starting|stall. Run with ``hvdliterun -np 4 --min-np 2
--blacklist-cooldown-range 0.001 0.001`` (``spawn``: and ``--cold-joins``; ``admit``: and
``--warm-spares 1``). World rank 3 SIGKILLs itself at a commit (``admit``: once rank 0's warm spare is
ready); when the survivors fill its slot at a later commit, world rank 1 dies inside that join: 0.3 s
into ``MPI_Comm_spawn`` (the new process, held 1 s before it starts MPI, is still starting), or as
the spare's admission begins.
``starting`` (the default join: rank 0 starts the new rank while the job trains): world rank 1 dies
at a step while the new rank is still starting; the new rank joins the two left later. The two left re-form, check by
collectives that they hold the same world (``world ok 2 ...``), and fill the free slots again; the job
ends at four ranks and rank 0 replays the committed steps alone (``ok elastic join death``).
``stall``: no rank dies inside the join; the first new rank stops itself (SIGSTOP) inside its
``hvd.init()``, so the three wait for it until ``--start-timeout`` and the communication deadline,
give it up and go on at three, and the next spawn fills the slot.
"""

import os
import signal
import sys
import threading
import time

import numpy as np
from elastic_sgd import assert_replayed, check_world, sgd_step

import hvdlite as hvd
import hvdlite.lifecycle
from hvdlite.core import runtime
from hvdlite.elastic import joining, spares

MODE = sys.argv[1]
VICTIM, JOIN_VICTIM, STEPS = 3, 1, 120


def die_inside(join):
    """``join`` (the spawn of new ranks or the admission of spares), inside which this rank dies: 0.3 s into the spawn, as
    the admission begins (while the others are in it; it takes milliseconds)."""
    def dying(*args, **kwargs):
        if MODE == "admit":
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        return join(*args, **kwargs)
    return dying


def kill_first_victim(state: hvd.elastic.ObjectState) -> None:
    """At a commit (``admit``: once rank 0's spare is ready): rank 3 dies, rank 1 dies in the next join."""
    if MODE == "admit":
        ready = sum(spares.mine().count(ready=True).values()) if hvd.rank() == 0 else 0
        if not hvd.broadcast_object(ready, root_rank=0, name="spare.ready"):
            return
    state.killed = True
    state.commit()
    if hvd.rank() == JOIN_VICTIM and MODE in ("spawn", "admit"):
        name = "spawn_ranks" if MODE == "spawn" else "admit_spares"
        setattr(joining, name, die_inside(getattr(joining, name)))
    if hvd.rank() == VICTIM:
        os.kill(os.getpid(), signal.SIGKILL)


def kill_while_a_new_rank_starts(state: hvd.elastic.ObjectState) -> None:
    """``starting``: once rank 3 died and rank 0 is starting a new rank for its slot, world rank 1 dies
    (once: the state records it first)."""
    starting = hvd.rank() == 0 and mine_starting()
    if not hvd.broadcast_object(starting, root_rank=0, name="new.rank.starting"):
        return
    state.second_killed = True
    state.commit()
    if runtime.current().process_ids[hvd.rank()] == str(JOIN_VICTIM):
        os.kill(os.getpid(), signal.SIGKILL)


def mine_starting() -> bool:
    return spares.mine().deferred_starting()


def hold_first_new_rank() -> None:
    """``stall``: the first spawned rank stops inside ``hvd.init()``, after its join watcher started.
    ``spawn``: it starts MPI only after 1 s, so that the spawn still runs when rank 1 dies 0.3 s into
    it (a process importing only NumPy and hvdlite can start within 0.3 s)."""
    if os.environ.get("HVDLITE_ELASTIC_SPAWN_PREFIX") != "g1.":
        return
    if MODE == "spawn":
        time.sleep(1.0)
    if MODE == "stall":
        join = hvdlite.lifecycle.join_parent
        hvdlite.lifecycle.join_parent = lambda: (os.kill(os.getpid(), signal.SIGSTOP), join())[1]


def main() -> None:
    hold_first_new_rank()
    hvd.init()
    # full: the launch's size, which a rank that joins later (at a smaller size) gets from the state.
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, w=np.zeros(3), step=0, killed=False,
                                    second_killed=False, full=hvd.size())
    sizes = [hvd.size()]

    def after_a_death() -> None:
        """Check the world after a death only: at an admission the new ranks run no reset callback."""
        if hvd.size() < sizes[-1]:
            check_world()
        sizes.append(hvd.size())

    state.register_reset_callbacks([after_a_death])

    @hvd.elastic.run
    def train(state):
        while state.step < STEPS or hvd.size() < state.full:
            if not state.killed and state.step >= 3:
                kill_first_victim(state)
            elif MODE == "starting" and state.killed and not state.second_killed:
                kill_while_a_new_rank_starts(state)
            sgd_step(state)
            state.commit()
            time.sleep(0.02)

    train(state)
    if hvd.rank() == 0:
        assert_replayed(state.w, state.step)
        print(f"ok elastic join death at size {hvd.size()}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
