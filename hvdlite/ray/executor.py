"""``RayExecutor``: Horovod's Ray API over hvdlite's remote jobs.

``start()`` reserves one placement group of ``num_workers`` bundles (strategy SPREAD: across nodes
where there are several) and starts one :class:`~.worker.Worker` actor in each bundle. Each
``run``/``run_remote`` has every actor serve its rank (a task service), runs ``hvdliterun`` over the
actors from the driver (:mod:`hvdlite.runner.remote.job`), and returns the ranks' results by rank.
An actor that dies takes its rank with it; the run then fails naming that rank.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import cloudpickle

from ..runner.remote.job import (
    LaunchOptions,
    finish_tasks,
    interface_flags,
    pickled_call,
    results_by_rank,
    run_launcher,
)
from ..runner.remote.task import TaskOutcome
from ..settings.config import environ
from .elastic import ElasticRayExecutor, ElasticRaySettings
from .engine import CUDA_DEVICES, RayJobError, ray_module
from .worker import Worker


@dataclasses.dataclass(frozen=True)
class RaySettings:
    """``RayExecutor.create_settings(...)``: how long to wait for the actors and their placement."""

    timeout_s: float = 30.0  # for the actors to start
    placement_group_timeout_s: float = 100.0  # for the cluster to have room for every worker
    nics: frozenset[str] | None = None  # the one network interface the job uses


def _release(ray: Any, group: Any, timeout: float, poll: float = 0.05) -> None:
    """Remove a placement group and wait (at most ``timeout`` s) until Ray says it is gone, so that a
    ``start()`` right after ``shutdown()`` finds its resources free."""
    ray.util.remove_placement_group(group)
    deadline = time.monotonic() + timeout
    while ray.util.placement_group_table(group).get("state") != "REMOVED" and time.monotonic() < deadline:
        time.sleep(poll)


class RayExecutor:
    """Runs a function as ``num_workers`` MPI ranks in Ray actors (Horovod's ``horovod.ray.RayExecutor``).

    ``cpus_per_worker`` / ``use_gpu`` / ``gpus_per_worker`` size each actor's bundle. With
    ``min_workers`` and ``max_workers`` instead of ``num_workers`` the job is elastic (an
    :class:`~hvdlite.ray.elastic.ElasticRayExecutor` runs it: ``start`` and ``run`` only).
    ``num_hosts`` and the other placement arguments are not supported and are refused.
    """

    def __init__(self, settings: RaySettings | None = None, num_workers: int | None = None,
                 cpus_per_worker: int = 1, use_gpu: bool = False, gpus_per_worker: int | None = None,
                 min_workers: int | None = None, max_workers: int | None = None, reset_limit: int | None = None,
                 elastic_timeout: float = 600, **unsupported: Any) -> None:
        given = sorted(name for name, value in unsupported.items() if value is not None)
        if given:
            raise RayJobError(f"RayExecutor: {', '.join(given)} not supported by hvdlite (give num_workers, or "
                              "min_workers and max_workers)")
        self.settings = settings or RaySettings()
        self._elastic = _elastic_executor(self.settings, num_workers, min_workers, max_workers, reset_limit,
                                          elastic_timeout, (use_gpu, cpus_per_worker, gpus_per_worker))
        if self._elastic is None and (isinstance(num_workers, bool) or not isinstance(num_workers, int)
                                      or num_workers < 1):
            raise RayJobError(f"RayExecutor needs num_workers, a positive integer; got {num_workers!r}")
        self.num_workers = num_workers
        self._bundle = {"CPU": cpus_per_worker, **({"GPU": gpus_per_worker or 1} if use_gpu else {})}
        self._workers: list[Any] = []
        self._placement_group: Any = None
        self._env: dict[str, str] = {}

    @staticmethod
    def create_settings(timeout_s: float = 30, placement_group_timeout_s: float = 100, nics: Any = None,
                        **_ssh: Any) -> RaySettings:
        """Settings for :class:`RayExecutor` (Horovod's ssh options are accepted and unused: no ssh here)."""
        return RaySettings(float(timeout_s), float(placement_group_timeout_s), frozenset(nics) if nics else None)

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self, executable_cls: type | None = None, executable_args: list | None = None,
              executable_kwargs: dict | None = None, extra_env_vars: Mapping[str, str] | None = None) -> None:
        """Reserve the placement group and start the actors (each holding ``executable_cls(...)``)."""
        if self._elastic is not None:
            if executable_cls is not None:
                raise RayJobError("RayExecutor.start(executable_cls=...) is not supported in elastic mode")
            self._elastic.start()
            self._elastic.env_vars.update(extra_env_vars or {})
            return
        if self._workers:
            raise RayJobError("RayExecutor.start(): already started; shutdown() first")
        ray = ray_module()
        if not ray.is_initialized():
            raise RayJobError("RayExecutor.start() needs Ray running: call ray.init(...) first")
        self._placement_group = self._reserve(ray)
        executable = cloudpickle.dumps((executable_cls, executable_args or [], executable_kwargs or {})) \
            if executable_cls is not None else None
        try:
            self._workers = self._actors(ray, executable)
        except BaseException:
            self.shutdown()
            raise
        self._env = dict(extra_env_vars or {})

    def shutdown(self) -> None:
        """Stop the actors and release their placement group (a no-op when not started)."""
        ray = ray_module()
        for worker in self._workers:
            ray.kill(worker)
        self._workers = []
        if self._placement_group is not None:
            _release(ray, self._placement_group, self.settings.timeout_s)
            self._placement_group = None

    def _reserve(self, ray: Any) -> Any:
        """The placement group, once Ray placed it: at once an error if the cluster, even idle, is too
        small; else waiting up to ``placement_group_timeout_s`` for others' actors to free room."""
        total = ray.cluster_resources()
        short = {name: (amount * self.num_workers, total.get(name, 0)) for name, amount in self._bundle.items()
                 if amount * self.num_workers > total.get(name, 0)}
        if short:
            raise RayJobError(f"RayExecutor: {self.num_workers} workers of {self._bundle} need " + ", ".join(
                f"{need:g} {name}" for name, (need, _) in short.items()) + "; the Ray cluster has " + ", ".join(
                f"{have:g} {name}" for name, (_, have) in short.items()) + " in all. Use fewer workers or add nodes")
        bundles = [dict(self._bundle) for _ in range(self.num_workers)]
        group = ray.util.placement_group(bundles, strategy="SPREAD")
        ready, _ = ray.wait([group.ready()], timeout=self.settings.placement_group_timeout_s)
        if not ready:
            _release(ray, group, self.settings.timeout_s)
            raise RayJobError(f"RayExecutor: the Ray cluster has no room for {self.num_workers} workers of "
                              f"{self._bundle} within {self.settings.placement_group_timeout_s:g} s "
                              f"(cluster: {ray.cluster_resources()}); use fewer workers or add nodes")
        return group

    def _actors(self, ray: Any, executable: bytes | None) -> list[Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor = ray.remote(Worker)
        workers = []
        for index in range(self.num_workers):
            strategy = PlacementGroupSchedulingStrategy(self._placement_group, placement_group_bundle_index=index)
            options = {"num_cpus": self._bundle["CPU"], "num_gpus": self._bundle.get("GPU", 0),
                       "scheduling_strategy": strategy}
            workers.append(actor.options(**options).remote(index, executable))
        ready, _ = ray.wait([w.__ray_ready__.remote() for w in workers], num_returns=len(workers),
                            timeout=self.settings.timeout_s)
        if len(ready) < len(workers):
            for worker in workers:
                ray.kill(worker)
            raise RayJobError(f"RayExecutor: {len(workers) - len(ready)} of {len(workers)} actors did not start "
                              f"within {self.settings.timeout_s:g} s")
        return workers

    # ---- running ---------------------------------------------------------------------------------
    def run(self, fn: Callable[..., Any], args: list | tuple | None = None, kwargs: Mapping[str, Any] | None = None,
            callbacks: Any = None) -> list[Any]:
        """``fn(*args, **kwargs)`` on every worker as one MPI job; the return values by rank, or a
        :class:`~hvdlite.runner.remote.job.RemoteJobError` naming the rank that failed. Elastic: the
        values of the ranks that finished, by final rank."""
        if self._elastic is not None:
            return self._elastic.run(fn, callbacks, args or (), kwargs)
        ray = ray_module()
        addresses, key = self._serve(fn, args, kwargs, callbacks)
        code, tail = run_launcher(addresses, key, self._launch_options())
        finish_tasks(addresses, key)
        return results_by_rank([self._outcome(ray, index, worker) for index, worker in enumerate(self._workers)],
                               code, tail)

    def run_remote(self, fn: Callable[..., Any], args: list | tuple | None = None,
                   kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """As :meth:`run`, without waiting: one ObjectRef per rank (``ray.get`` gives its value, or
        raises its failure)."""
        addresses, key = self._serve(fn, args, kwargs, None)
        refs = [worker.result.remote() for worker in self._workers]

        def launch() -> None:
            run_launcher(addresses, key, self._launch_options())
            finish_tasks(addresses, key)

        threading.Thread(target=launch, name="hvdlite-ray-launch", daemon=True).start()
        return refs

    def execute(self, fn: Callable[[Any], Any]) -> list[Any]:
        """``fn(executable)`` on every worker (no MPI job); the return values by worker."""
        ray = ray_module()
        self._require_started("execute")
        return ray.get([worker.execute.remote(cloudpickle.dumps(fn)) for worker in self._workers])

    def _serve(self, fn: Callable[..., Any], args: Any, kwargs: Any, callbacks: Any) -> tuple[list, bytes]:
        """Have every actor serve its rank of a new run of ``fn``; (their addresses, the run's key)."""
        self._require_started("run")
        if callbacks:
            raise RayJobError("RayExecutor.run(callbacks=...) is not supported by hvdlite")
        payload = pickled_call(fn, args or (), kwargs or {}, "Ray actors", RayJobError)
        key = secrets.token_bytes(32)
        ray = ray_module()
        return [tuple(address) for address in ray.get([w.serve.remote(payload, key) for w in self._workers])], key

    def _launch_options(self) -> LaunchOptions:
        env = {**environ(), **self._env}
        # Ray gives each actor its GPUs in CUDA_VISIBLE_DEVICES; the driver's value, forwarded by the
        # launcher, would override it in the rank the actor starts.
        env.pop(CUDA_DEVICES, None)
        return LaunchOptions(env, launcher_args=interface_flags(self.settings.nics, RayJobError))

    def _outcome(self, ray: Any, index: int, worker: Any) -> TaskOutcome:
        try:
            return ray.get(worker.outcome.remote())
        except ray.exceptions.RayActorError as exc:
            return TaskOutcome(index, False, error=f"its Ray actor died ({type(exc).__name__}: "
                                                   f"{str(exc).splitlines()[0]})", lost=True)

    def _require_started(self, what: str) -> None:
        if self._elastic is not None:
            raise RayJobError(f"RayExecutor.{what}() is not supported in elastic mode (min_workers/max_workers)")
        if not self._workers:
            raise RayJobError(f"RayExecutor.{what}() before start(): call start() first")


def _elastic_executor(settings: RaySettings, num_workers: int | None, min_workers: int | None,
                      max_workers: int | None, reset_limit: int | None, elastic_timeout: float,
                      slot: tuple[bool, int, int | None]) -> Any:
    """The ElasticRayExecutor of a RayExecutor given min_workers/max_workers; None for a fixed size."""
    if min_workers is None and max_workers is None:
        return None
    if num_workers is not None:
        raise RayJobError("RayExecutor: give num_workers (a fixed size) or min_workers/max_workers (elastic), "
                          "not both")
    elastic = ElasticRaySettings(min_workers or 1, max_workers, reset_limit, float(elastic_timeout),
                                 settings.timeout_s, settings.nics)
    use_gpu, cpus, gpus = slot
    return ElasticRayExecutor(elastic, use_gpu, cpus, gpus)
