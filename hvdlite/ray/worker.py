"""The Ray actor that hosts one rank of a :class:`~hvdlite.ray.RayExecutor` job.

A plain class (the executors wrap it with ``ray.remote``): one
:class:`~hvdlite.runner.remote.task.TaskService` per run (per elastic run: one slot attempt), on the address Ray knows this node by,
and the user's executable object for ``execute``.
"""

from __future__ import annotations

from typing import Any

import cloudpickle

from ..runner.remote.elastic import serve_task
from ..runner.remote.job import RemoteJobError
from ..runner.remote.task import TaskOutcome, TaskService


class Worker:
    """One actor: serves its rank of each run and runs ``execute`` functions."""

    def __init__(self, index: int, executable: bytes | None) -> None:
        import ray

        self.index = index
        self._host = ray.util.get_node_ip_address()
        cls, args, kwargs = cloudpickle.loads(executable) if executable else (None, (), {})
        self.executable = cls(*args, **kwargs) if cls is not None else None
        self._service: TaskService | None = None

    def serve(self, payload: bytes, key: bytes) -> tuple[str, int]:
        """Start serving this rank of a new run; the address the driver's agent reaches."""
        self._service = TaskService(self.index, payload, key, self._host)
        return self._service.address

    def serve_slot(self, attempt: int, payload: bytes, key: bytes, registry: tuple[str, int]) -> None:
        """Serve this actor's slot of an elastic run until the driver says it is over (blocking)."""
        serve_task(self.index, attempt, payload, key, self._host, registry)

    def outcome(self) -> TaskOutcome:
        """What became of this rank, once the driver said the run is over."""
        assert self._service is not None, "serve() first"
        service, self._service = self._service, None
        return service.outcome()

    def result(self) -> Any:
        """This rank's return value, once the run is over; its failure raised as RemoteJobError."""
        outcome = self.outcome()
        if not outcome.ok:
            raise RemoteJobError(f"rank {self.index} {'failed' if outcome.reported else 'has no result'}:\n"
                                 f"{outcome.error}")
        return cloudpickle.loads(outcome.value)

    def execute(self, fn: bytes) -> Any:
        """``fn(executable)`` here, without MPI (Horovod's ``RayExecutor.execute``)."""
        return cloudpickle.loads(fn)(self.executable)
