"""Ends a rank the elastic job spawned when the job gives it up, from outside the process.

A spawned process's ``MPI_Init`` connects to the ranks that spawned it. If one of them dies meanwhile,
the world gives the new ranks up (:func:`hvdlite.elastic.reform.apply`), and the new process would
wait in ``MPI_Init`` for ever, holding Python's GIL, so no thread of its own can end it (measured with
mpi4py 4.1.2: a thread's ticks stop for the whole call). So ``hvd.init()`` in a spawned rank first
starts ``python .../join_watch.py PID RUN_DIR SERVICE ID...`` (run by path, standard library only:
importing hvdlite takes 1.5 s), the job's token on its stdin: every LOOK_SECONDS it looks whether the
job gave ID up or ID exited (the run directory's files, or hvdliterun's channel) and then SIGKILLs
PID, saying why; it ends when its stdin closes (the rank joined).
"""

from __future__ import annotations

import os
import select
import signal
import sys

try:
    from .channel import ChannelError, request
except ImportError:  # run by path
    from channel import ChannelError, request  # type: ignore[no-redef]

LOOK_SECONDS = 0.5


def abandoned_marker(process_id: str) -> str:
    """The run directory's file that says the job gave the process ``process_id`` up (a warm spare whose
    spawn failed, or new ranks a death interrupted)."""
    return f"rank.{process_id}.abandoned"


def gone(run_dir: str, service: str, token: str, process_ids: list[str]) -> set[str]:
    """Which of ``process_ids`` have exited, or were given up: their files in ``run_dir`` (the rank
    wrapper's status file, named as :func:`hvdlite.utils.failed_peers.status_file` does: this module
    runs by path, on the standard library only), else hvdliterun's record of them (another host)."""
    try:
        names = set(os.listdir(run_dir)) if run_dir else set()
    except OSError:
        names = set()
    found = {process_id for process_id in process_ids
             if abandoned_marker(process_id) in names or f"rank.{process_id}.status" in names}
    if not service or len(found) == len(process_ids):
        return found
    try:
        return found | set(request(service, token, {"op": "gone", "ids": process_ids}).get("exited", []))
    except ChannelError:
        return found  # hvdliterun unreachable: look again


def main() -> None:
    pid, run_dir, service, *process_ids = sys.argv[1:]
    token = sys.stdin.readline().strip()
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], LOOK_SECONDS)
        if readable and not os.read(sys.stdin.fileno(), 1):
            return  # the rank joined
        if gone(run_dir, service, token, process_ids):
            print(f"hvdlite: the job gave new rank {process_ids[0]} up (a rank died while it joined, or it did not "
                  "join within --start-timeout and the communication deadline); it ends",
                  file=sys.stderr, flush=True)
            os.kill(int(pid), signal.SIGKILL)
            return


if __name__ == "__main__":
    main()
