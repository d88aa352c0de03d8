"""Elastic remote jobs (``hvdlite.spark.run_elastic``, Ray's elastic executor): tasks come and go.

The engine starts up to ``max_np`` tasks, each when it has room, and starts a task again when its
executor or node died. Every task attempt registers with the driver's :class:`ElasticRegistry`
under its own host alias (``task-3.0``, then ``task-3.1`` if the engine ran task 3 again: hvdlite
gives no new rank to a host whose rank failed, and a retried task is a new slot). The registry keeps
two files of the run directory current: the agent's alias table and the host list that the
discovery script prints. ``hvdliterun`` runs in elastic mode over them
(``--host-discovery-script``): ranks whose task died are left behind by the survivors, which keep
their processes (:mod:`hvdlite.elastic`), and a task that registers gets a rank at the next commit,
up to ``max_np``. The job's results are those of the ranks that finished, in their final rank order.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle

from .job import LaunchOptions, RemoteJobError, finish_tasks, launch, write_agent, write_tasks
from .registry import LOST, Registry
from .task import TaskOutcome, TaskService
from .wire import Address, request

HOSTS_LIST = "hosts.txt"  # the live aliases, one "alias:1" a line, printed by the discovery script
DISCOVERY_SCRIPT = "discover"  # prints HOSTS_LIST for hvdliterun --host-discovery-script


def elastic_alias(index: int, attempt: int) -> str:
    """The host name Hydra and hvdlite's elastic mode know attempt ``attempt`` of task ``index`` by."""
    return f"task-{index}.{attempt}"


@dataclasses.dataclass(frozen=True)
class ElasticSizes:
    """How many ranks: ``num_proc`` to start with, never fewer than ``min_np`` nor more than ``max_np``."""

    num_proc: int
    min_np: int
    max_np: int
    elastic_timeout: float | None = None  # seconds to wait for min_np slots (hvdliterun's default: 600)
    reset_limit: int | None = None  # world changes before the job ends (None: no limit)

    def __post_init__(self) -> None:
        if not 1 <= self.min_np <= self.num_proc <= self.max_np:
            raise ValueError(f"elastic sizes must satisfy 1 <= min_np <= num_proc <= max_np, got min_np="
                             f"{self.min_np}, num_proc={self.num_proc}, max_np={self.max_np}")


def serve_task(index: int, attempt: int, payload: bytes, key: bytes, host: str, registry: Address) -> None:
    """One task attempt of an elastic job: register, serve what the job runs here, report the outcome.

    A :class:`RankRaised` when the rank here raised, at once: the job goes on without this attempt,
    and the engine (Spark's task retry, the Ray executor) starts the task again, which joins anew.
    """
    name = elastic_alias(index, attempt)
    service = TaskService(index, payload, key, host, host_alias=name)
    request(registry, key, ("join", index, attempt, service.address))
    outcome = service.outcome()
    request(registry, key, ("outcome", name, outcome))
    if outcome.reported and not outcome.ok:
        raise RankRaised(f"the rank in {name} raised; the elastic job goes on without it, and this task may be "
                         f"run again to join it:\n{outcome.error}")


class RankRaised(RemoteJobError):
    """The rank of an elastic job's task attempt raised: the attempt fails so that its engine runs it again."""


class ElasticRegistry(Registry):
    """The driver's record of the task attempts that registered, written to ``run_dir`` as they come.

    Of each task index only the latest attempt is live (an engine retries a task once it is gone).
    """

    def __init__(self, host: str, key: bytes, run_dir: str) -> None:
        self._run_dir, self.key = run_dir, key
        self._known: dict[str, Address] = {}  # every attempt that registered, by alias
        self._live: dict[int, tuple[int, str]] = {}  # task index -> (attempt, alias) of its latest attempt
        self._results: dict[str, TaskOutcome] = {}
        write_agent(run_dir, key)
        write_discovery_script(run_dir)
        self._publish()
        super().__init__(host, key, 0)

    def wait_for(self, count: int, timeout: float, still_starting: Callable[[], bool], poll: float = 0.1) -> bool:
        """True once ``count`` tasks are live; False if ``still_starting()`` turns false first; a
        TimeoutError after ``timeout`` s says how many came."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._live) < count:
                if not still_starting():
                    return False
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {len(self._live)} of the {count} tasks to start with started within "
                                       f"{timeout:g} s")
                self._changed.wait(poll)
            return True

    def live(self) -> dict[str, Address]:
        """The live attempts' addresses, by alias."""
        with self._changed:
            return {name: self._known[name] for _, name in self._live.values()}

    def finished(self, alive: Sequence[str], timeout: float) -> dict[str, TaskOutcome]:
        """The outcome of each of the ``alive`` attempts, waiting at most ``timeout`` s for them."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not set(alive) <= set(self._results) and time.monotonic() < deadline:
                self._changed.wait(max(0.0, min(0.1, deadline - time.monotonic())))
            return {name: self._results.get(name, TaskOutcome(-1, False, error=LOST, lost=True)) for name in alive}

    def reported(self, names: Sequence[str]) -> dict[str, TaskOutcome]:
        """The outcomes already reported by those of the attempts ``names`` that did."""
        with self._changed:
            return {name: self._results[name] for name in names if name in self._results}

    def _record(self, kind: str, *fields: Any) -> None:
        with self._changed:
            if kind == "join":
                self._join(*fields)
            elif kind == "outcome":
                name, outcome = fields
                self._results.setdefault(name, outcome)
            self._changed.notify_all()

    def _join(self, index: int, attempt: int, address: Address) -> None:
        name = elastic_alias(index, attempt)
        if index in self._live and self._live[index][0] >= attempt:
            return  # a late message from an attempt already replaced
        self._known[name] = tuple(address)
        self._live[index] = (attempt, name)
        self._publish()

    def _publish(self) -> None:
        """The agent's table first, then the host list: a listed alias must be reachable."""
        write_tasks(self._run_dir, self._known)
        path = os.path.join(self._run_dir, HOSTS_LIST)
        with open(path + ".tmp", "w") as handle:
            handle.writelines(f"{name}:1\n" for _, (_, name) in sorted(self._live.items()))
        os.replace(path + ".tmp", path)


def write_discovery_script(run_dir: str) -> None:
    """``run_dir``/discover: the discovery script that prints the registry's host list."""
    path = os.path.join(run_dir, DISCOVERY_SCRIPT)
    with open(path, "w") as handle:
        handle.write(f"#!/bin/sh\nexec cat {shlex.quote(os.path.join(run_dir, HOSTS_LIST))}\n")
    os.chmod(path, 0o700)


def elastic_launcher_command(sizes: ElasticSizes, run_dir: str, launcher_args: Sequence[str] = ()) -> list[str]:
    """The ``hvdliterun`` command of an elastic job over the tasks the registry of ``run_dir`` lists."""
    discover = os.path.join(run_dir, DISCOVERY_SCRIPT)
    python = sys.executable
    optional = [*(["--elastic-timeout", f"{sizes.elastic_timeout:g}"] if sizes.elastic_timeout is not None else []),
                *(["--reset-limit", str(sizes.reset_limit)] if sizes.reset_limit else [])]
    return [python, "-m", "hvdlite.runner", "-np", str(sizes.num_proc), "--min-np", str(sizes.min_np),
            "--max-np", str(sizes.max_np), "--host-discovery-script", discover, "--slots-per-host", "1",
            "--launcher-agent", os.path.join(run_dir, "agent"), *optional, *launcher_args,
            python, "-m", "hvdlite.runner.remote.rank"]


def run_elastic_job(registry: ElasticRegistry, run_dir: str, sizes: ElasticSizes, options: LaunchOptions,
                    report_seconds: float) -> list[Any]:
    """Run the elastic job over the registry's tasks (``num_proc`` of them live); the results of the
    ranks that finished, by final rank, or a :class:`RemoteJobError` naming the failure."""
    code, tail = launch(elastic_launcher_command(sizes, run_dir, options.launcher_args), options)
    tasks = registry.live()
    reached = set(finish_tasks(list(tasks.values()), registry.key))
    outcomes = registry.finished([name for index, name in enumerate(tasks) if index in reached], report_seconds)
    # An attempt whose rank raised reported and ended before the finish: what it said names the failure.
    return elastic_results({**registry.reported(list(tasks)), **outcomes}, code, tail)


def elastic_results(outcomes: dict[str, TaskOutcome], code: int, tail: Sequence[str]) -> list[Any]:
    """The values of the ranks that finished, by their final rank; the job went on without the others.
    A failed job raises, naming the first rank that raised (by its task's alias) or quoting the output."""
    if code == 0:
        done = sorted((outcome.final_rank if outcome.final_rank is not None else -1, name, outcome)
                      for name, outcome in outcomes.items() if outcome.ok)
        return [cloudpickle.loads(outcome.value) for _, _, outcome in done]
    failed = [(name, outcome) for name, outcome in outcomes.items() if outcome.reported and not outcome.ok]
    if failed:
        name, outcome = failed[0]
        raise RemoteJobError(f"the elastic job failed (exit code {code}); the rank in {name} raised:\n{outcome.error}")
    output = "\n".join(tail)
    raise RemoteJobError(f"the elastic job failed (exit code {code}); its last output:\n{output}")

