"""``ElasticRayExecutor``: Horovod's elastic Ray API over hvdlite's elastic remote jobs.

Each run starts one actor per slot, up to ``max_num_proc`` (default: as many as the cluster's
resources hold), wherever Ray has room; actors Ray cannot place yet wait in its queue. The job
starts once ``min_num_proc`` actors serve their slot (:mod:`hvdlite.runner.remote.elastic`). An
actor that dies takes its rank with it: the others keep their processes and go on, and the slot's
actor is started again (a new attempt), joining at the next commit once Ray has room for it.
"""

from __future__ import annotations

import dataclasses
import secrets
import tempfile
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..runner.remote.elastic import ElasticRegistry, ElasticSizes, RankRaised, run_elastic_job
from ..runner.remote.job import REPORT_SECONDS, LaunchOptions, interface_flags, pickled_call
from ..settings.config import environ
from .engine import CUDA_DEVICES, RayJobError, ray_module
from .worker import Worker

RAISED_RANK_RETRIES = 3  # a slot whose rank raised starts again this often (Spark's default: a task runs 4 times)


@dataclasses.dataclass(frozen=True)
class ElasticRaySettings:
    """``ElasticRayExecutor.create_settings(...)``: the job's sizes and how long to wait."""

    min_num_proc: int = 1
    max_num_proc: int | None = None  # None: as many as the cluster's resources hold
    reset_limit: int | None = None
    elastic_timeout: float = 600.0  # for min_num_proc slots after losing ranks
    timeout_s: float = 30.0  # for the first min_num_proc actors to start
    nics: frozenset[str] | None = None


class ElasticRayExecutor:
    """Runs a function as an elastic job in Ray actors (Horovod's ``horovod.ray.ElasticRayExecutor``).

    ``cpus_per_slot`` / ``use_gpu`` / ``gpus_per_slot`` size each actor; ``env_vars`` go to the ranks.
    """

    def __init__(self, settings: ElasticRaySettings, use_gpu: bool = False, cpus_per_slot: int = 1,
                 gpus_per_slot: int | None = None, env_vars: Mapping[str, str] | None = None,
                 override_discovery: bool = True) -> None:
        if gpus_per_slot and not use_gpu:
            raise RayJobError("ElasticRayExecutor: gpus_per_slot is set but use_gpu is False")
        self.settings = settings
        self._resources = {"num_cpus": cpus_per_slot, "num_gpus": (gpus_per_slot or 1) if use_gpu else 0}
        self.env_vars = dict(env_vars or {})
        self._max_np: int | None = None

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: int | None = None, reset_limit: int | None = None,
                        elastic_timeout: float = 600, timeout_s: float = 30, ssh_identity_file: Any = None,
                        nics: Any = None, min_np: int | None = None, max_np: int | None = None,
                        **_unused: Any) -> ElasticRaySettings:
        """Settings for :class:`ElasticRayExecutor` (``min_np``/``max_np``: Horovod's older names;
        ``ssh_identity_file`` is accepted and unused: no ssh here)."""
        return ElasticRaySettings(min_np if min_np is not None else min_num_proc,
                                  max_np if max_np is not None else max_num_proc, reset_limit,
                                  float(elastic_timeout), float(timeout_s), frozenset(nics) if nics else None)

    def start(self) -> None:
        """Check that Ray runs and can hold ``min_num_proc`` actors; settle ``max_num_proc``."""
        ray = ray_module()
        if not ray.is_initialized():
            raise RayJobError("ElasticRayExecutor.start() needs Ray running: call ray.init(...) first")
        room = self._slots_in(ray.cluster_resources())
        wanted = self.settings.max_num_proc or room
        if room < self.settings.min_num_proc:
            raise RayJobError(f"ElasticRayExecutor: min_num_proc={self.settings.min_num_proc} actors of "
                              f"{self._resources} do not fit the Ray cluster ({ray.cluster_resources()}), which holds "
                              f"{room}")
        self._sizes(self.settings.min_num_proc, wanted)  # checks the settings
        self._max_np = wanted

    def run(self, worker_fn: Callable[..., Any], callbacks: Any = None, args: Any = (),
            kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """``worker_fn(*args, **kwargs)`` as one elastic job; the values of the ranks that finished,
        by final rank, or a :class:`~hvdlite.runner.remote.job.RemoteJobError` saying why it failed."""
        max_np = self._max_np
        if max_np is None:
            raise RayJobError("ElasticRayExecutor.run() before start(): call start() first")
        if callbacks:
            raise RayJobError("ElasticRayExecutor.run(callbacks=...) is not supported by hvdlite")
        payload = pickled_call(worker_fn, args or (), kwargs or {}, "Ray actors", RayJobError)
        with tempfile.TemporaryDirectory(prefix="hvdlite-ray-elastic-") as run_dir:
            return self._run(payload, run_dir, max_np)

    def _run(self, payload: bytes, run_dir: str, max_np: int) -> list[Any]:
        ray = ray_module()
        key = secrets.token_bytes(32)
        registry = ElasticRegistry(ray.util.get_node_ip_address(), key, run_dir)
        actors = SlotActors(ray, self._resources, max_np, (payload, key, registry.address))
        try:
            first = min(self.settings.min_num_proc, max_np)
            registry.wait_for(first, self.settings.timeout_s, lambda: True)
            sizes = self._sizes(max(first, len(registry.live())), max_np)
            return run_elastic_job(registry, run_dir, sizes, self._launch_options(), REPORT_SECONDS)
        finally:
            registry.close()
            actors.stop()

    def _sizes(self, num_proc: int, max_np: int) -> ElasticSizes:
        try:
            return ElasticSizes(min(num_proc, max_np), self.settings.min_num_proc, max_np,
                                self.settings.elastic_timeout, self.settings.reset_limit)
        except ValueError as exc:
            raise RayJobError(f"ElasticRayExecutor: {exc}") from None

    def _slots_in(self, resources: Mapping[str, float]) -> int:
        slots = int(resources.get("CPU", 0) // max(self._resources["num_cpus"], 1e-9))
        if self._resources["num_gpus"]:
            slots = min(slots, int(resources.get("GPU", 0) // self._resources["num_gpus"]))
        return slots

    def _launch_options(self) -> LaunchOptions:
        env = {**environ(), **self.env_vars}
        env.pop(CUDA_DEVICES, None)  # each actor's own, from Ray (see RayExecutor)
        return LaunchOptions(env, launcher_args=interface_flags(self.settings.nics, RayJobError))


class SlotActors:
    """One actor per slot for one run; an actor that dies is replaced by its slot's next attempt,
    which Ray starts once it has room. A slot whose rank raised starts its next attempt on the same
    actor (as Spark runs a failed task again; killing the actor would take the detached MPI proxy of
    the rank that left, and with it the job), up to :data:`RAISED_RANK_RETRIES` times."""

    def __init__(self, ray: Any, resources: Mapping[str, Any], slots: int, serve_args: tuple) -> None:
        self._ray, self._resources, self._serve_args = ray, dict(resources), serve_args
        self._actor = ray.remote(Worker)
        self._running: dict[Any, tuple[int, int, Any]] = {}  # serve call -> (slot, attempt, actor)
        self._actors: list[Any] = []  # every actor started, to kill at the end, finished or not
        self._raised = [0] * slots  # per slot: how many of its attempts' ranks raised
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        for index in range(slots):
            self._launch(index, 0)
        self._watcher = threading.Thread(target=self._watch, name="hvdlite-ray-slots", daemon=True)
        self._watcher.start()

    def _launch(self, index: int, attempt: int, actor: Any = None) -> None:
        """Serve attempt ``attempt`` of slot ``index`` on ``actor``, or on a new actor."""
        with self._lock:
            if actor is None:
                actor = self._actor.options(**self._resources).remote(index, None)
                self._actors.append(actor)
            self._running[actor.serve_slot.remote(attempt, *self._serve_args)] = (index, attempt, actor)

    def _watch(self) -> None:
        while not self._stopped.is_set():
            with self._lock:
                calls = list(self._running)
            done, _ = self._ray.wait(calls, num_returns=1, timeout=0.5) if calls else ([], [])
            for call in done:
                with self._lock:
                    index, attempt, actor = self._running.pop(call)
                again, on = self._next_attempt(call, index, actor)
                if again and not self._stopped.is_set():
                    self._launch(index, attempt + 1, on)

    def _next_attempt(self, call: Any, index: int, actor: Any) -> tuple[bool, Any]:
        """Whether the slot of a finished serve call starts again, and on which actor (None: a new
        one): its actor died, or its rank raised (retries left)."""
        try:
            self._ray.get(call)
        except self._ray.exceptions.RayActorError:
            return True, None
        except RankRaised:  # Ray's error for a raising call is also an instance of the call's error
            self._raised[index] += 1
            return self._raised[index] <= RAISED_RANK_RETRIES, actor
        except Exception:  # noqa: BLE001 - a slot that failed otherwise is not started again
            return False, None
        return False, None

    def stop(self) -> None:
        """Stop replacing actors and kill them all (the run is over)."""
        self._stopped.set()
        self._watcher.join(5)
        with self._lock:
            actors, self._actors = self._actors, []
            self._running.clear()
        for actor in actors:
            self._ray.kill(actor)
