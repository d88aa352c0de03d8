"""torch's ``monitored_barrier`` on the hvdlite group: a barrier that names the ranks that did not come.

As gloo's: rank 0 waits for a message from every other rank, up to the timeout, then answers each.
Unlike gloo's, rank 0's answer says who was missing, so every rank that arrived raises the same
error naming them (gloo's other ranks only time out). Each barrier is numbered: a late rank's
message, arriving after rank 0 gave up, is recognised as stale by the next barrier and dropped.
Messages travel on the group's point-to-point communicator under a tag of their own.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ...errors import HvdliteError

TAG = 32767  # the largest tag MPI guarantees; torch's users' tags are small
_POLL_SECONDS = 0.0005


def monitored_barrier(comm: Any, count: int, timeout: float | None, wait_all_ranks: bool, group: str) -> None:
    """Wait until every rank of ``comm`` called barrier number ``count`` (counted by the caller,
    from 1), or raise naming those that did not within ``timeout`` seconds (all of them with
    ``wait_all_ranks``, else the first)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    deadline = None if timeout is None else time.monotonic() + timeout
    if rank == 0:
        missing = _arrivals(comm, count, deadline)
        named = missing if wait_all_ranks else missing[:1]
        answer = np.array([count, len(named), *named, *[0] * (size - len(named))], np.int64)
        for peer in sorted(set(range(1, size)) - set(missing)):
            comm.Send(answer, dest=peer, tag=TAG)
    else:
        comm.Send(np.array([count], np.int64), dest=0, tag=TAG)
        answer = _answer(comm, count, size, deadline, timeout, group)
        named = answer[2:2 + int(answer[1])].tolist()
    if named:
        raise HvdliteError(f"monitored_barrier on {group}: rank(s) {named} did not reach it within {timeout:g} s"
                           + ("" if wait_all_ranks else " (the first; wait_all_ranks=True names every one)"))


def _arrivals(comm: Any, count: int, deadline: float | None) -> list[int]:
    """On rank 0: receive barrier ``count``'s message from every rank; the ranks that sent none by
    ``deadline`` (their receives are cancelled)."""
    from mpi4py import MPI

    buffers = {peer: np.zeros(1, np.int64) for peer in range(1, comm.Get_size())}
    requests = {peer: comm.Irecv(buffer, source=peer, tag=TAG) for peer, buffer in buffers.items()}
    while requests:
        for peer, request in list(requests.items()):
            if request.Test():
                if buffers[peer][0] == count:
                    del requests[peer]
                else:  # a stale arrival at an earlier barrier that timed out: wait for this one's
                    requests[peer] = comm.Irecv(buffers[peer], source=peer, tag=TAG)
        if requests and deadline is not None and time.monotonic() > deadline:
            for request in requests.values():
                request.Cancel()
            MPI.Request.Waitall(list(requests.values()))
            return sorted(requests)
        time.sleep(_POLL_SECONDS)
    return []


def _answer(comm: Any, count: int, size: int, deadline: float | None, timeout: float | None,
            group: str) -> np.ndarray:
    """On another rank: rank 0's answer to barrier ``count`` (who was missing), or raise if none
    comes by ``deadline``."""
    answer = np.zeros(2 + size, np.int64)
    while True:
        request = comm.Irecv(answer, source=0, tag=TAG)
        while not request.Test():
            if deadline is not None and time.monotonic() > deadline + 1.0:  # rank 0 answers at its deadline
                request.Cancel()
                request.Wait()
                raise HvdliteError(f"monitored_barrier on {group}: rank 0 did not answer within {timeout:g} s "
                                   "(it has not reached the barrier)")
            time.sleep(_POLL_SECONDS)
        if answer[0] == count:
            return answer
