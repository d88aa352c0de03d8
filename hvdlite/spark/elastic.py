"""``hvdlite.spark.run_elastic``: ``hvdlite.spark.run`` whose ranks may come and go (Horovod's ``run_elastic``).

The ranks run in one ordinary (not barrier) stage of ``max_np`` tasks: Spark starts each task when
a slot is free, and runs a task again when it failed or its executor died. Each task attempt serves
one slot of an elastic job (:mod:`hvdlite.runner.remote.elastic`). The job starts once ``num_proc``
tasks run; when an executor dies, the ranks of the other tasks keep their processes, re-form the job
without it and go on (``fn`` wraps its training in ``hvd.elastic.run``), and a task Spark starts
again, or one that waited for a slot, joins at the next commit, up to ``max_np``.
"""

from __future__ import annotations

import secrets
import socket
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

from ..runner.remote.elastic import ElasticRegistry, ElasticSizes, run_elastic_job, serve_task
from ..runner.remote.job import REPORT_SECONDS, LaunchOptions, pickled_call
from ..runner.remote.wire import Address
from ..settings.config import environ
from .job import (
    DEFAULT_START_TIMEOUT,
    SparkJobError,
    Stage,
    checked_num_proc,
    driver_host,
    launcher_args,
    running_context,
)


def run_elastic(fn: Callable[..., Any], args: tuple = (), kwargs: Mapping[str, Any] | None = None,
                num_proc: int | None = None, min_np: int | None = None, max_np: int | None = None,
                start_timeout: float | None = None, elastic_timeout: float | None = None,
                reset_limit: int | None = None, env: Mapping[str, str] | None = None, stdout: IO[str] | None = None,
                stderr: IO[str] | None = None, verbose: int = 1, nics: Any = None,
                prefix_output_with_timestamp: bool = False, *, min_num_proc: int | None = None,
                max_num_proc: int | None = None) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` as an elastic job of ``num_proc`` ranks (at least ``min_np``, at most
    ``max_np``) in Spark tasks; the return values of the ranks that finished, by their final rank.

    ``num_proc`` defaults to the cluster's task slots and must fit in them; ``min_np`` and ``max_np``
    (also ``min_num_proc`` / ``max_num_proc``) default to ``num_proc``. ``elastic_timeout``: seconds the
    job waits for ``min_np`` slots after losing ranks (default 600); ``reset_limit``: world changes
    before the job ends. The other arguments are :func:`hvdlite.spark.run`'s. A rank that raises
    leaves the job like a dead one, and its task fails, so that Spark runs it again (up to
    ``spark.task.maxFailures`` times) and its new rank joins; the job fails when fewer than ``min_np``
    ranks can go on, or Spark gives the task up, with
    :class:`~hvdlite.runner.remote.job.RemoteJobError` naming why.
    """
    context = running_context()
    num_proc = checked_num_proc(context, num_proc)
    sizes = _sizes(num_proc, _either("min_np", min_np, min_num_proc), _either("max_np", max_np, max_num_proc),
                   elastic_timeout, reset_limit)
    payload = pickled_call(fn, args, kwargs or {}, "Spark tasks", SparkJobError)
    launch = LaunchOptions(dict(env) if env is not None else environ(), stdout, stderr, verbose,
                           launcher_args(None, nics), prefix_output_with_timestamp)
    with tempfile.TemporaryDirectory(prefix="hvdlite-spark-elastic-") as run_dir:
        return _run(context, sizes, payload, launch, run_dir, start_timeout or DEFAULT_START_TIMEOUT)


def _either(name: str, horovod: int | None, alias: int | None) -> int | None:
    if horovod is not None and alias is not None and horovod != alias:
        raise SparkJobError(f"run_elastic: {name}={horovod} and {name.replace('np', 'num_proc')}={alias} disagree")
    return horovod if horovod is not None else alias


def _sizes(num_proc: int, min_np: int | None, max_np: int | None, elastic_timeout: float | None,
           reset_limit: int | None) -> ElasticSizes:
    try:
        return ElasticSizes(num_proc, num_proc if min_np is None else min_np, num_proc if max_np is None else max_np,
                            elastic_timeout, reset_limit)
    except ValueError as exc:
        raise SparkJobError(f"run_elastic: {exc}") from None


def _run(context: Any, sizes: ElasticSizes, payload: bytes, launch: LaunchOptions, run_dir: str,
         start_timeout: float) -> list[Any]:
    key = secrets.token_bytes(32)
    registry = ElasticRegistry(driver_host(context), key, run_dir)
    group = f"hvdlite.spark.run_elastic-{secrets.token_hex(4)}"
    stage = Stage(context, group, sizes.max_np, run_elastic_task, (payload, key, registry.address), barrier=False)
    try:
        if not registry.wait_for(sizes.num_proc, start_timeout, stage.running):
            stage.raise_failure()
            raise SparkJobError("the Spark stage ended before the first tasks started")
        return run_elastic_job(registry, run_dir, sizes, launch, REPORT_SECONDS)
    finally:
        registry.close()
        stage.cancel()


def run_elastic_task(payload: bytes, key: bytes, registry: Address) -> Iterator[int]:
    """One task attempt: serve one slot of the elastic job until the driver says it is over."""
    from pyspark import TaskContext

    context = TaskContext.get()
    serve_task(context.partitionId(), context.attemptNumber(), payload, key, _address_toward(registry[0]), registry)
    yield context.partitionId()


def _address_toward(host: str) -> str:
    """This machine's address on the route to ``host`` (the driver), which reaches us back. A UDP
    socket's connect sends nothing; it only picks the route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return probe.getsockname()[0]
