"""Forming the survivors' communicator without hanging when one more member dies meanwhile.

MPICH's ``MPI_Comm_create_group`` (and every blocking collective after it) waits for ever for a
member that died after the survivors agreed on the new world: nothing in MPICH fails a pending call
on a dead peer. Measured (2026-12-02, MPICH 5.0.2): a ``Create_group`` blocked on a dead member in
one thread does not stop another thread's ``Create_group`` of the members still alive (another tag)
from completing. So the group is created in a helper thread while the caller watches the members:
if one dies, the attempt is abandoned (its thread stays blocked, harmlessly) and the survivors agree
again without it. A join (``MPI_Comm_spawn`` of new ranks, the admission of warm spares) is watched
the same way: the newcomers the world gave up end themselves (:func:`ends_if`). hvdlite's start on
the new communicator is watched too; there it cannot be abandoned (it has built half a runtime), so
a death inside it ends this rank with the reason.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from ..errors import HvdliteError

log = logging.getLogger("hvdlite")
T = TypeVar("T")

_WATCH_SECONDS = 0.005  # how often the caller looks at the members while MPI works in the helper thread
_START_GRACE_SECONDS = 2.0  # a start still blocked this long after a member died will not finish


def create_group(comm: Any, ranks: Sequence[int], member_ids: Sequence[str], read_dead: Callable[[list[str]], list[str]],
                 tag: int, deadline_seconds: float | None) -> Any | None:
    """``comm.Create_group`` of ``ranks`` (process ids ``member_ids``); None when one of them died first.

    Raises ``HvdliteError`` when the creation did not finish within ``deadline_seconds`` with every
    member alive (a member stopped without dying).
    """
    return watched(lambda: comm.Create_group(comm.Get_group().Incl(list(ranks)), tag=tag), member_ids, read_dead,
                   deadline_seconds, "the new world")


def watched(call: Callable[[], T], member_ids: Sequence[str], read_dead: Callable[[list[str]], list[str]],
            deadline_seconds: float | None, what: str) -> T | None:
    """``call()`` (blocking MPI calls among ``member_ids``) in a helper thread; None when one of the
    members died first (the thread stays blocked, harmlessly: see the module's doc).

    Raises ``HvdliteError`` naming ``what`` when ``call`` did not finish within ``deadline_seconds``
    with every member alive (a member stopped without dying), and ``call``'s own error.
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc

    helper = threading.Thread(target=run, name="hvdlite-form-world", daemon=True)
    helper.start()
    give_up_at = time.monotonic() + deadline_seconds if deadline_seconds else None
    while helper.is_alive():
        helper.join(_WATCH_SECONDS)
        if helper.is_alive() and read_dead(list(member_ids)):
            return None
        if give_up_at is not None and time.monotonic() > give_up_at:
            raise HvdliteError(f"{what} of rank(s) {list(member_ids)} was not formed within the communication "
                               f"deadline ({deadline_seconds:g} s) although none of them died: one stopped "
                               "answering while the job re-formed; the job cannot go on")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


@contextlib.contextmanager
def ends_if(given_up: Callable[[], bool], why: str, every: float) -> Iterator[None]:
    """Ends this process quietly (status 0, logging ``why``) when ``given_up()`` turns true, looked at
    every ``every`` seconds, while the block waits in MPI calls that cannot be left: a process about to
    join the world, which the world gave up because a member died meanwhile."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(every):
            if given_up() and not done.is_set():
                log.warning("%s: this process ends", why)
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)

    with _watching(watch, done, "hvdlite-watch-join"):
        yield


@contextlib.contextmanager
def watched_start(member_ids: Sequence[str], read_dead: Callable[[list[str]], list[str]]) -> Iterator[None]:
    """Ends this rank, naming the dead, when a member dies while hvdlite starts on the new world and
    the start is still blocked :data:`_START_GRACE_SECONDS` later (MPI's call cannot be left)."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.02):
            dead = read_dead(list(member_ids))
            if dead and not done.wait(_START_GRACE_SECONDS):
                message = (f"hvdlite: rank(s) {dead} died while the survivors started on the new world, inside "
                           "MPI calls that cannot be left; this rank ends so that the job does not hang")
                log.error(message)
                print(message, file=sys.stderr, flush=True)
                os._exit(1)

    with _watching(watch, done, "hvdlite-watch-start"):
        yield


@contextlib.contextmanager
def _watching(watch: Callable[[], None], done: threading.Event, name: str) -> Iterator[None]:
    """Runs ``watch`` in a daemon thread while the block runs; ``done`` is set when it ends."""
    threading.Thread(target=watch, name=name, daemon=True).start()
    try:
        yield
    finally:
        done.set()
