"""``hvdlite.spark.run``: the Spark side of a remote job (:mod:`hvdlite.runner.remote`).

The driver checks the session, the slots and the function before anything starts, then submits
one barrier stage of ``num_proc`` tasks. Each task starts a task service and registers its address
with the driver; the driver runs ``hvdliterun`` over the tasks, tells them when the job is over,
and each task sends its rank's outcome back (not through the stage's result: a stage with a killed
task is retried by Spark and ends much later). Whatever happens, the stage is then cancelled, so
nothing is left running.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

from ..errors import HvdliteError
from ..runner.remote.job import (
    REPORT_SECONDS,
    LaunchOptions,
    finish_tasks,
    interface_flags,
    pickled_call,
    results_by_rank,
    run_launcher,
)
from ..runner.remote.registry import Registry
from ..runner.remote.task import TaskService
from ..runner.remote.wire import Address, request
from ..settings.config import environ

DEFAULT_START_TIMEOUT = 600.0  # Horovod's HOROVOD_SPARK_START_TIMEOUT default
SLOTS_WAIT_SECONDS = 30.0  # a session just started: how long its first executors may take to register
SLOTS_SETTLE_SECONDS = 3.0  # ... and how long the slot count must stand still below what is needed
log = logging.getLogger("hvdlite.spark")


class SparkJobError(HvdliteError):
    """hvdlite.spark.run cannot start: no session, too few slots, a function that cannot be pickled."""


def run(fn: Callable[..., Any], args: tuple = (), kwargs: Mapping[str, Any] | None = None, num_proc: int | None = None,
        start_timeout: float | None = None, use_mpi: bool | None = None, use_gloo: bool | None = None,
        extra_mpi_args: str | None = None, env: Mapping[str, str] | None = None, stdout: IO[str] | None = None,
        stderr: IO[str] | None = None, verbose: int = 1, nics: Any = None,
        prefix_output_with_timestamp: bool = False, executable: str | None = None) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` as ``num_proc`` MPI ranks in Spark tasks; its return values by rank.

    ``num_proc`` defaults to the cluster's task slots (``defaultParallelism``), one rank per slot;
    more ranks than the cluster can run at once is an error here, before anything starts.
    ``start_timeout`` bounds the wait for every task to start (default 600 s). ``env``: the ranks'
    environment (default: this process's). ``stdout``/``stderr``: where the ranks' tagged output
    goes (default: this process's), each line tagged as Horovod's, ``[0]<stdout>:...``, after the time
    if ``prefix_output_with_timestamp``. ``extra_mpi_args`` go to mpiexec; ``nics`` names the
    network interface (one) for the job. ``use_mpi`` / ``use_gloo`` (Horovod's controller choice)
    are accepted: hvdlite's ranks always talk over MPI. A rank that raises makes this raise
    :class:`RemoteJobError` with its rank and traceback. ``executable`` is not supported (the ranks
    run this Python).
    """
    warn_controller_choice(use_mpi, use_gloo)
    if executable is not None:
        raise SparkJobError("hvdlite.spark.run(executable=...) is not supported: the ranks run this driver's Python")
    context = running_context()
    num_proc = checked_num_proc(context, num_proc)
    payload = pickled_call(fn, args, kwargs or {}, "Spark tasks", SparkJobError)
    launch = LaunchOptions(dict(env) if env is not None else environ(), stdout, stderr, verbose,
                           launcher_args(extra_mpi_args, nics), prefix_output_with_timestamp)
    job = _SparkJob(context, num_proc, payload, start_timeout or DEFAULT_START_TIMEOUT)
    return job.run(launch)


def warn_controller_choice(use_mpi: bool | None, use_gloo: bool | None) -> None:
    """Horovod's ``use_gloo=True`` asked for its Gloo controller; hvdlite has one (MPI), so it only says so."""
    if use_gloo:
        log.warning("hvdlite.spark: use_gloo=True is ignored: hvdlite's ranks always talk over MPI")
    if use_mpi is False and not use_gloo:
        log.warning("hvdlite.spark: use_mpi=False is ignored: hvdlite's ranks always talk over MPI")


def _pyspark() -> Any:
    try:
        import pyspark
    except ImportError as exc:
        raise ImportError("hvdlite.spark needs PySpark: pip install 'hvdlite[spark]'") from exc
    return pyspark


def running_context() -> Any:
    """The running SparkContext, or a SparkJobError saying to start one."""
    context = _pyspark().SparkContext._active_spark_context
    if context is None or context._jsc is None:
        raise SparkJobError("hvdlite.spark.run needs a running Spark session: start one first "
                            "(SparkSession.builder.master(...).getOrCreate())")
    return context


def task_slots(context: Any) -> int:
    """How many tasks the cluster can run at once (a barrier stage needs one slot per task)."""
    scala = context._jsc.sc()
    return int(scala.maxNumConcurrentTasks(scala.resourceProfileManager().defaultResourceProfile()))


def _slots_for(context: Any, needed: int, poll: float = 0.2) -> int:
    """The cluster's task slots, waiting while executors are still registering (a session just
    started has none yet): until there are ``needed``, the count stood still for
    ``SLOTS_SETTLE_SECONDS``, or ``SLOTS_WAIT_SECONDS`` passed."""
    start = settled = time.monotonic()
    slots = last = task_slots(context)
    while slots < needed:
        now = time.monotonic()
        if slots != last:
            last, settled = slots, now
        if now - start > SLOTS_WAIT_SECONDS or (slots > 0 and now - settled > SLOTS_SETTLE_SECONDS):
            break
        time.sleep(poll)
        slots = task_slots(context)
    return slots


def checked_num_proc(context: Any, num_proc: int | None) -> int:
    if num_proc is None:
        num_proc = max(context.defaultParallelism, 1)
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise SparkJobError(f"num_proc must be a positive integer, got {num_proc!r}")
    slots = _slots_for(context, num_proc)
    if num_proc > slots:
        raise SparkJobError(f"num_proc={num_proc} ranks need {num_proc} task slots at once (a barrier stage), but "
                            f"the Spark cluster has {slots}; give a smaller num_proc or add executors/cores")
    return num_proc


def launcher_args(extra_mpi_args: str | None, nics: Any) -> tuple[str, ...]:
    mpi_flags = ("--mpi-args", extra_mpi_args) if extra_mpi_args else ()
    return mpi_flags + interface_flags(nics, SparkJobError)


@dataclasses.dataclass
class _SparkJob:
    """One run: the barrier stage in a thread, the launcher here."""

    context: Any
    num_proc: int
    payload: bytes
    start_timeout: float

    def run(self, launch: LaunchOptions) -> list[Any]:
        key = secrets.token_bytes(32)
        registry = Registry(driver_host(self.context), key, self.num_proc)
        group = f"hvdlite.spark.run-{secrets.token_hex(4)}"
        stage = Stage(self.context, group, self.num_proc, run_task, (self.payload, key, registry.address))
        try:
            addresses = registry.addresses(self.start_timeout, stage.running)
            if addresses is None:  # the stage ended before every task started
                stage.raise_failure()
                raise SparkJobError("the Spark stage ended before every task started")
            code, tail = run_launcher(addresses, key, launch)
            alive = finish_tasks(addresses, key)
            return results_by_rank(registry.outcomes(alive, REPORT_SECONDS), code, tail)
        finally:
            registry.close()
            stage.cancel()


def driver_host(context: Any) -> str:
    """The address the executors reach the driver at (Spark's own), as an IP."""
    host = context.getConf().get("spark.driver.host") or socket.gethostname()
    return socket.gethostbyname(host)


class Stage:
    """A stage of ``num_tasks`` tasks each running ``task(*task_args)``, in a thread under a job group
    that can be cancelled: a barrier stage (every task at once, all retried together) unless
    ``barrier`` is false (each task when a slot is free, a failed one retried alone)."""

    def __init__(self, context: Any, group: str, num_tasks: int, task: Callable[..., Iterator[int]],
                 task_args: tuple, barrier: bool = True) -> None:
        self._context = context
        self._group = group
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._collect, args=(num_tasks, task, task_args, barrier), daemon=True)
        self._thread.start()

    def _collect(self, num_tasks: int, task: Callable[..., Iterator[int]], task_args: tuple, barrier: bool) -> None:
        try:
            self._context.setJobGroup(self._group, self._group.rpartition("-")[0], interruptOnCancel=True)
            rdd = self._context.parallelize(range(num_tasks), num_tasks)
            (rdd.barrier() if barrier else rdd).mapPartitions(lambda partition: task(*task_args)).collect()
        except BaseException as exc:  # noqa: B036 - handed to the driver's thread by result()
            self._error = exc

    def running(self) -> bool:
        return self._thread.is_alive()

    def raise_failure(self) -> None:
        """The stage's own error, once it ended (if it failed)."""
        self._thread.join()
        if self._error is not None:
            raise SparkJobError(f"the Spark stage of {self._group.rpartition('-')[0]} failed: {self._error}") \
                from self._error

    def cancel(self) -> None:
        if self._thread.is_alive():
            self._context.cancelJobGroup(self._group)
            self._thread.join(30)


def run_task(payload: bytes, key: bytes, registry: Address) -> Iterator[int]:
    """One barrier task: serve this rank of the job, send the driver what became of it."""
    from pyspark import BarrierTaskContext

    context = BarrierTaskContext.get()
    index = context.partitionId()
    service = TaskService(index, payload, key, _task_host(context, index))
    request(registry, key, ("register", index, service.address))
    request(registry, key, ("outcome", index, service.outcome()))
    yield index


def _task_host(context: Any, index: int) -> str:
    """This task's address as Spark knows its executor (reachable from the driver), as an IP."""
    executor = context.getTaskInfos()[index].address
    return socket.gethostbyname(executor.rpartition(":")[0] or socket.gethostname())
