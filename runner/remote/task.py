"""A task's side of a remote job: it runs what Hydra starts here and keeps its rank's outcome.

A :class:`TaskService` lives in a Spark task or a Ray actor for one job. It answers four messages:

- ``("run", command)`` from the agent: run Hydra's proxy command with ``/bin/sh`` (as ssh would),
  stream its output back and end with its exit code. The proxy dies with the thread that started
  it, so a task the engine kills takes its rank with it;
- ``("payload",)`` from the rank: the pickled ``(fn, args, kwargs)``;
- ``("result", rank, ok, data)`` from the rank: its pickled return value, or its traceback;
- ``("watch",)`` from the rank: never answered; the connection closes when this task dies, and the
  rank then ends itself (an elastic rank runs under a shell that a dead proxy does not take along);
- ``("finish",)`` from the driver: the job is over; :meth:`TaskService.outcome` returns. In an
  elastic job it also returns once the rank raised: the job goes on without this task attempt.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import threading
from multiprocessing.connection import Connection
from typing import Any

from hvdlite.settings.config import environ

from ..process import die_with_parent
from .wire import Address, format_address, listen

TASK_VARIABLE = "HVDLITE_REMOTE_TASK"  # the rank's way back to its task (host:port) ...
KEY_VARIABLE = "HVDLITE_REMOTE_KEY"  # ... and the job's key, hex
ALIAS_VARIABLE = "HVDLITE_HOST_ALIAS"  # an elastic job's name for this task's slot (hvdlite.settings)


@dataclasses.dataclass(frozen=True)
class TaskOutcome:
    """What became of one task's rank: ``ok`` with its pickled value, or not, with the reason."""

    index: int
    ok: bool
    value: bytes = b""  # the rank's return value, pickled (ok)
    error: str = ""  # the rank's traceback, or why no result came (not ok)
    reported: bool = False  # the rank itself reported (a value or a traceback)
    lost: bool = False  # the task itself died (killed by its engine, its executor or node gone)
    final_rank: int | None = None  # the rank's rank in the job's last world (elastic jobs renumber)


class TaskService:
    """Serves one task of a remote job (see the module docstring).

    ``host_alias``: in an elastic job, the name the launcher's host list gives this task; its ranks
    may then have any MPI rank (the job renumbers them), and learn the alias from the environment.
    """

    def __init__(self, index: int, payload: bytes, key: bytes, host: str, host_alias: str | None = None) -> None:
        self.index = index
        self.host_alias = host_alias
        self._payload = payload
        self._key = key
        self._listener = listen(host, key)
        self.address: Address = (host, self._listener.address[1])
        self._finished = threading.Event()
        self._outcome: TaskOutcome | None = None
        self._ran_code: int | None = None
        threading.Thread(target=self._accept, name=f"hvdlite-task-{index}", daemon=True).start()

    def outcome(self, timeout: float | None = None) -> TaskOutcome:
        """Wait for the driver's ``finish`` (at most ``timeout`` s), then say what became of the rank."""
        self._finished.wait(timeout)
        self._listener.close()
        if self._outcome is not None:
            return self._outcome
        why = "the job ended before its rank started here" if self._ran_code is None else \
            f"its rank ended without a result (the MPI proxy here exited with code {self._ran_code})"
        return TaskOutcome(self.index, False, error=why)

    def _accept(self) -> None:
        while not self._finished.is_set():
            try:
                connection = self._listener.accept()
            except OSError:  # closed, or a client without the key (AuthenticationError is one)
                if self._finished.is_set():
                    return
                continue
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: Connection) -> None:
        with connection:
            try:
                message = connection.recv()
            except (EOFError, OSError):
                return
            kind = message[0]
            if kind == "run":
                self._run(connection, message[1])
            elif kind == "payload":
                connection.send(self._payload)
            elif kind == "result":
                self._outcome = self._checked_result(*message[1:])
                connection.send("ok")
                if self.host_alias is not None and not self._outcome.ok:
                    self._finished.set()  # the rank leaves the elastic job; this attempt is over
            elif kind == "watch":
                self._finished.wait()
            elif kind == "finish":
                self._finished.set()
                connection.send("ok")

    def _checked_result(self, rank: int, ok: bool, data: Any, final_rank: int | None = None) -> TaskOutcome:
        """The rank's report; a static job's results are returned by task index, so a rank in another
        task is an error there."""
        if rank != self.index and self.host_alias is None:
            return TaskOutcome(self.index, False, error=f"MPI rank {rank} ran in task {self.index}: the launcher "
                                                         "placed the ranks out of order", reported=True)
        return TaskOutcome(self.index, ok, data if ok else b"", "" if ok else data, True, final_rank=final_rank)

    def _run(self, connection: Connection, command: str) -> None:
        """Run ``command`` here, streaming its output to ``connection``.

        In a static job, the proxy dies with this thread (``die_with_parent``), and Hydra ends the job.
        An elastic job's proxy outlives the task: a proxy's death kills Hydra's mpiexec (an assertion
        on its closed control connection), so the proxy stays, the rank ends itself (its watch on
        this task, :mod:`.rank`), and the proxy reports that death as any other rank's.
        """
        env = {**environ(), TASK_VARIABLE: format_address(self.address), KEY_VARIABLE: self._key.hex(),
               **({ALIAS_VARIABLE: self.host_alias} if self.host_alias else {})}
        detached = {"start_new_session": True, "preexec_fn": _ignore_broken_pipes} if self.host_alias else \
            {"preexec_fn": die_with_parent}
        # exec: the shell becomes the command, which keeps the death signal (a forked child would not).
        process = subprocess.Popen(["/bin/sh", "-c", f"exec {command}"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=env, **detached)
        lock = threading.Lock()
        errors = threading.Thread(target=_relay, args=(process.stderr, "err", connection, lock), daemon=True)
        errors.start()
        _relay(process.stdout, "out", connection, lock)
        errors.join()
        self._ran_code = process.wait()
        with lock:
            _send(connection, ("exit", self._ran_code))


def _ignore_broken_pipes() -> None:
    """A detached proxy's output pipe closes with its task: writing there must not kill it."""
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)


def _relay(stream: Any, kind: str, connection: Connection, lock: threading.Lock) -> None:
    for chunk in iter(lambda: stream.read1(65536), b""):
        with lock:
            _send(connection, (kind, chunk))


def _send(connection: Connection, message: tuple) -> None:
    try:
        connection.send(message)
    except OSError:  # the agent is gone (mpiexec ended): the process finishes on its own or with the task
        pass
