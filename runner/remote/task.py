"""A task's side of a remote job: it runs what Hydra starts here and keeps its rank's outcome.

A :class:`TaskService` lives in a Spark task or a Ray actor for one job. It answers four messages:

- ``("run", command)`` from the agent: run Hydra's proxy command with ``/bin/sh`` (as ssh would),
  stream its output back and end with its exit code. The proxy dies with the thread that started
  it, so a task the engine kills takes its rank with it;
- ``("payload",)`` from the rank: the pickled ``(fn, args, kwargs)``;
- ``("result", rank, ok, data)`` from the rank: its pickled return value, or its traceback;
- ``("finish",)`` from the driver: the job is over; :meth:`TaskService.outcome` returns.
"""

from __future__ import annotations

import dataclasses
import subprocess
import threading
from multiprocessing.connection import Connection
from typing import Any

from hvdlite.settings.config import environ

from ..process import die_with_parent
from .wire import Address, format_address, listen

TASK_VARIABLE = "HVDLITE_REMOTE_TASK"  # the rank's way back to its task (host:port) ...
KEY_VARIABLE = "HVDLITE_REMOTE_KEY"  # ... and the job's key, hex


@dataclasses.dataclass(frozen=True)
class TaskOutcome:
    """What became of one task's rank: ``ok`` with its pickled value, or not, with the reason."""

    index: int
    ok: bool
    value: bytes = b""  # the rank's return value, pickled (ok)
    error: str = ""  # the rank's traceback, or why no result came (not ok)
    reported: bool = False  # the rank itself reported (a value or a traceback)
    lost: bool = False  # the task itself died (killed by its engine, its executor or node gone)


class TaskService:
    """Serves one task of a remote job (see the module docstring)."""

    def __init__(self, index: int, payload: bytes, key: bytes, host: str) -> None:
        self.index = index
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
            elif kind == "finish":
                self._finished.set()
                connection.send("ok")

    def _checked_result(self, rank: int, ok: bool, data: Any) -> TaskOutcome:
        """The rank's report; results are returned by task index, so a rank in another task is an error."""
        if rank != self.index:
            return TaskOutcome(self.index, False, error=f"MPI rank {rank} ran in task {self.index}: the launcher "
                                                         "placed the ranks out of order", reported=True)
        return TaskOutcome(self.index, ok, data if ok else b"", "" if ok else data, True)

    def _run(self, connection: Connection, command: str) -> None:
        """Run ``command`` here, streaming its output to ``connection``; in this thread, which the
        process dies with (``die_with_parent``)."""
        env = {**environ(), TASK_VARIABLE: format_address(self.address), KEY_VARIABLE: self._key.hex()}
        # exec: the shell becomes the command, which keeps the death signal (a forked child would not).
        process = subprocess.Popen(["/bin/sh", "-c", f"exec {command}"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=env, preexec_fn=die_with_parent)
        lock = threading.Lock()
        errors = threading.Thread(target=_relay, args=(process.stderr, "err", connection, lock), daemon=True)
        errors.start()
        _relay(process.stdout, "out", connection, lock)
        errors.join()
        self._ran_code = process.wait()
        with lock:
            _send(connection, ("exit", self._ran_code))


def _relay(stream: Any, kind: str, connection: Connection, lock: threading.Lock) -> None:
    for chunk in iter(lambda: stream.read1(65536), b""):
        with lock:
            _send(connection, (kind, chunk))


def _send(connection: Connection, message: tuple) -> None:
    try:
        connection.send(message)
    except OSError:  # the agent is gone (mpiexec ended): the process finishes on its own or with the task
        pass
