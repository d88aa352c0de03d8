"""What every rank of a remote job runs (``python -m hvdlite.runner.remote.rank``).

It fetches ``(fn, args, kwargs)`` from the task it runs in, calls ``fn``, and hands the task the
pickled result; if ``fn`` raises, the task gets the traceback and this process exits with 1. In a
static job that ends the MPI job (Hydra stops the other ranks); in an elastic job the rank leaves as
a dead one does, and the others re-form without it. It dies with the MPI proxy that started it, and
so with its task.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback

import cloudpickle

from hvdlite.settings.config import environ

from ..process import die_with_parent
from .task import ALIAS_VARIABLE, KEY_VARIABLE, TASK_VARIABLE
from .wire import connect, parse_address, request


def main() -> int:
    # The task's proxy dies with the task (a Spark task or Ray actor killed); its ranks must too, or
    # they live on as orphans holding the job's connections open.
    die_with_parent()
    env = environ()
    address, key = parse_address(env[TASK_VARIABLE]), bytes.fromhex(env[KEY_VARIABLE])
    rank = int(env.get("PMI_RANK", "-1"))  # Hydra's: MPI is not started here, fn starts it (hvd.init)
    fn, args, kwargs = cloudpickle.loads(request(address, key, ("payload",)))
    threading.Thread(target=_end_with_task, args=(address, key, rank), name="hvdlite-task-watch", daemon=True).start()
    try:
        value = cloudpickle.dumps(fn(*args, **kwargs))
    except BaseException:  # noqa: B036 - the driver must hear of any failure, then we exit
        request(address, key, ("result", rank, False, traceback.format_exc()))
        traceback.print_exc()
        _abort(whole_job=ALIAS_VARIABLE not in env)
    request(address, key, ("result", rank, True, value, _final_rank()))
    return 0


def _end_with_task(address: tuple[str, int], key: bytes, rank: int) -> None:
    """SIGKILL this process when its task dies (the task's end closes the watch connection): an
    elastic rank's parent is a shell that lives on without the proxy, and a rank left running would
    stay in the job for a task that is gone."""
    try:
        with connect(address, key) as connection:
            connection.send(("watch",))
            connection.recv()
    except (EOFError, OSError):
        sys.stderr.write(f"hvdlite: rank {rank}: its task is gone; it ends\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def _final_rank() -> int | None:
    """The rank this process had in the job's last world (elastic jobs renumber), if fn started hvdlite."""
    runtime = sys.modules.get("hvdlite.core.runtime")
    return runtime.last_rank() if runtime is not None else None


def _abort(whole_job: bool) -> None:
    """End this rank at once, and with MPI started and ``whole_job`` the whole job: peers waiting on
    this rank in a collective would otherwise wait for their deadline, and MPI_Finalize at exit for
    ever. An elastic job's rank only exits: its peers see it dead and go on without it."""
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if whole_job and mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Abort(1)
    os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
