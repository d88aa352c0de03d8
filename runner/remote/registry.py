"""Where tasks tell the driver their address and, at the end, their rank's outcome, when the engine
does not carry them (Spark: a stage's result comes only once every task, retries included, ended)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from .task import TaskOutcome
from .wire import Address, listen

LOST = "its task was lost before it could report (killed, or its executor died)"


class Registry:
    """The driver's listener for ``("register", index, address)`` and ``("outcome", index, outcome)``."""

    def __init__(self, host: str, key: bytes, size: int) -> None:
        self._listener = listen(host, key)
        self.address: Address = (host, self._listener.address[1])
        self._size = size
        self._addresses: dict[int, Address] = {}
        self._outcomes: dict[int, TaskOutcome] = {}
        self._changed = threading.Condition()
        self._closed = False
        threading.Thread(target=self._accept, name="hvdlite-registry", daemon=True).start()

    def addresses(self, timeout: float, still_starting: Callable[[], bool], poll: float = 0.1) -> list[Address] | None:
        """Every task's address by index once all registered; None if ``still_starting()`` turns
        false first. A TimeoutError after ``timeout`` s names the tasks still missing."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._addresses) < self._size:
                if not still_starting():
                    return None
                if time.monotonic() > deadline:
                    missing = sorted(set(range(self._size)) - set(self._addresses))
                    raise TimeoutError(f"{len(missing)} of {self._size} tasks did not start within {timeout:g} s "
                                       f"(missing: {missing})")
                self._changed.wait(poll)
            return [self._addresses[index] for index in range(self._size)]

    def outcomes(self, alive: Sequence[int], timeout: float) -> list[TaskOutcome]:
        """Every task's outcome by index, waiting at most ``timeout`` s for those of the ``alive`` tasks
        (the others are gone); a task that sent none was lost."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not set(alive) <= set(self._outcomes) and time.monotonic() < deadline:
                self._changed.wait(max(0.0, min(0.1, deadline - time.monotonic())))
            return [self._outcomes.get(index, TaskOutcome(index, False, error=LOST, lost=True)) for index in range(self._size)]

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                with self._listener.accept() as connection:
                    self._record(*connection.recv())
                    connection.send("ok")
            except (OSError, EOFError, ValueError, TypeError):  # closed, a client without the key, a bad message
                continue

    def _record(self, kind: str, index: int, value: object) -> None:
        if not 0 <= index < self._size:
            return
        with self._changed:
            # The first attempt of each task counts: a retried stage's tasks come too late to join.
            if kind == "register" and index not in self._addresses:
                self._addresses[index] = tuple(value)
            elif kind == "outcome" and index not in self._outcomes:
                self._outcomes[index] = value
            self._changed.notify_all()
