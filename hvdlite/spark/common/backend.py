"""Horovod's estimator backends: where an estimator's training function runs.

An estimator given ``backend=`` runs its training through ``backend.run`` on
``backend.num_processes()`` ranks, as Horovod's do; without one it runs through
:func:`hvdlite.spark.run` on ``num_proc`` ranks (a :class:`SparkBackend` of its own).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ...errors import HvdliteError
from ...settings.config import environ

# hvdlite.spark.run, handed over by hvdlite.spark when it is imported (always before this module,
# its parent package): this folder sits below hvdlite.spark and does not import it.
_spark_run: list[Callable[..., list[Any]]] = []


def use_spark_run(run: Callable[..., list[Any]]) -> None:
    """Make ``run`` (``hvdlite.spark.run``) what :class:`SparkBackend` runs the training with."""
    _spark_run[:] = [run]


class Backend:
    """Horovod's interface: run the training function on every rank, report how many ranks."""

    def run(self, fn: Callable[..., Any], args: tuple = (), kwargs: Mapping[str, Any] | None = None,
            env: Mapping[str, str] | None = None) -> list[Any]:
        """``fn(*args, **kwargs)`` on every rank; the return values, by rank."""
        raise NotImplementedError

    def num_processes(self) -> int:
        """How many ranks :meth:`run` uses."""
        raise NotImplementedError


class SparkBackend(Backend):
    """Runs the training with :func:`hvdlite.spark.run` on ``num_proc`` ranks (default: the
    cluster's ``defaultParallelism``); ``env`` is the ranks' environment (default: the driver's),
    and ``kwargs`` go to :func:`hvdlite.spark.run` (``start_timeout``, ``stdout``, ``verbose``, ...)."""

    def __init__(self, num_proc: int | None = None, env: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        self._num_proc = num_proc
        self._env = dict(env) if env is not None else None
        self._kwargs = kwargs

    def run(self, fn: Callable[..., Any], args: tuple = (), kwargs: Mapping[str, Any] | None = None,
            env: Mapping[str, str] | None = None) -> list[Any]:
        full_env = {**(self._env if self._env is not None else environ()), **(env or {})}
        return _spark_run[0](fn, args=args, kwargs=kwargs, num_proc=self.num_processes(), env=full_env,
                             **self._kwargs)

    def num_processes(self) -> int:
        if self._num_proc is not None:
            return self._num_proc
        import pyspark

        context = pyspark.SparkContext._active_spark_context
        if context is None:
            raise HvdliteError("SparkBackend() without num_proc needs a running Spark session, whose "
                               "defaultParallelism is the number of ranks: start one first")
        return max(context.defaultParallelism, 1)


__all__ = ["Backend", "SparkBackend", "use_spark_run"]
