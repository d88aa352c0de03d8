"""The driver's side of a remote job: ``hvdliterun`` over the engine's tasks, then results by rank.

The tasks are already running (Spark barrier tasks, Ray actors), each with a
:class:`~.task.TaskService`. :func:`run_launcher` writes a run directory (one host alias per task,
the agent that reaches them, the job's key), runs ``hvdliterun`` with Hydra's remote-start program
set to that agent (the Kubernetes MPI job path), and relays the job's output. :func:`finish_tasks`
tells every task the job is over; :func:`results_by_rank` turns their outcomes into the ranks'
return values, or an error naming the rank that failed and its traceback.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

import cloudpickle

from hvdlite.errors import HvdliteError

from ..process import die_with_parent
from .agent import KEY_FILE, TASKS_FILE
from .task import TaskOutcome
from .wire import Address, request

TAIL_LINES = 20  # the job's last output lines quoted in an error
FINISH_SECONDS = 30.0  # after the job, how long the driver waits for a task to take its "finish"
REPORT_SECONDS = 30.0  # then how long a live task may take to send its rank's outcome


class RemoteJobError(HvdliteError):
    """A rank of a Spark or Ray job failed, or never ran; the message names it and says why."""


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """How to run the launcher: the ranks' environment, where their output goes, extra flags."""

    env: Mapping[str, str]
    stdout: IO[str] | None = None  # default: this process's
    stderr: IO[str] | None = None
    verbose: int = 1
    launcher_args: tuple[str, ...] = ()  # more hvdliterun flags, e.g. ("--timeout", "60")
    timestamps: bool = False  # Horovod's prefix_output_with_timestamp: each rank's line starts with the time


def pickled_call(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], where: str,
                 error: type[Exception]) -> bytes:
    """``(fn, args, kwargs)`` as the ranks receive it; ``error`` if ``fn`` cannot be called or any of it
    cannot be pickled (``where``: the engine's tasks, for the message)."""
    if not callable(fn):
        raise error(f"fn must be callable, got {type(fn).__name__}")
    try:
        return cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
    except Exception as exc:  # pickling raises many kinds (TypeError, PicklingError, AttributeError...)
        raise error(f"cannot send {getattr(fn, '__name__', fn)!r} with its arguments to the {where}: they cannot "
                    f"be pickled ({type(exc).__name__}: {exc})") from exc


def interface_flags(nics: Any, error: type[Exception]) -> tuple[str, ...]:
    """hvdliterun's flags for Horovod's ``nics`` (a name or a collection of names): one interface, or ``error``."""
    if not nics:
        return ()
    names = [nics] if isinstance(nics, str) else sorted(nics)
    if len(names) != 1:
        raise error(f"nics: hvdlite uses one network interface, got {names}")
    return ("--network-interface", names[0])


def alias(index: int) -> str:
    """The host name Hydra knows task ``index`` by."""
    return f"task-{index}"


def launcher_command(num_proc: int, run_dir: str, launcher_args: Sequence[str] = ()) -> list[str]:
    """The ``hvdliterun`` command that runs one rank in each of ``num_proc`` tasks."""
    python = sys.executable
    return [python, "-m", "hvdlite.runner", "-np", str(num_proc), "--hostfile", os.path.join(run_dir, "hostfile"),
            "--launcher-agent", os.path.join(run_dir, "agent"), *launcher_args,
            python, "-m", "hvdlite.runner.remote.rank"]


def write_run_dir(run_dir: str, addresses: Sequence[Address], key: bytes) -> None:
    """The hostfile (one slot per alias), the aliases' addresses, the key, and the agent script."""
    with open(os.path.join(run_dir, "hostfile"), "w") as handle:
        handle.writelines(f"{alias(index)} slots=1\n" for index in range(len(addresses)))
    write_tasks(run_dir, {alias(index): address for index, address in enumerate(addresses)})
    write_agent(run_dir, key)


def write_tasks(run_dir: str, tasks: Mapping[str, Address]) -> None:
    """The agent's table of host aliases and task addresses, replaced atomically (the agent may read it)."""
    path = os.path.join(run_dir, TASKS_FILE)
    with open(path + ".tmp", "w") as handle:
        json.dump({name: list(address) for name, address in tasks.items()}, handle)
    os.replace(path + ".tmp", path)


def write_agent(run_dir: str, key: bytes) -> None:
    """The job's key (private) and the agent script Hydra runs in place of ssh."""
    key_path = os.path.join(run_dir, KEY_FILE)
    with open(os.open(key_path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as handle:
        handle.write(key)
    agent = os.path.join(run_dir, "agent")
    with open(agent, "w") as handle:
        handle.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m hvdlite.runner.remote.agent "
                     f"{shlex.quote(run_dir)} \"$@\"\n")
    os.chmod(agent, 0o700)


def run_launcher(addresses: Sequence[Address], key: bytes, options: LaunchOptions) -> tuple[int, list[str]]:
    """Run the job over the tasks at ``addresses`` (index = rank); its exit code and last output lines."""
    with tempfile.TemporaryDirectory(prefix="hvdlite-remote-") as run_dir:
        write_run_dir(run_dir, addresses, key)
        return launch(launcher_command(len(addresses), run_dir, options.launcher_args), options)


def launch(argv: Sequence[str], options: LaunchOptions) -> tuple[int, list[str]]:
    """Run the launcher command ``argv``, relaying its output; its exit code and last output lines."""
    if options.verbose >= 2:
        print(f"hvdlite: {shlex.join(argv)}", file=options.stderr or sys.stderr, flush=True)
    process = subprocess.Popen(list(argv), env=dict(options.env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               preexec_fn=die_with_parent)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    pumps = [threading.Thread(target=_relay, args=(process.stdout, options.stdout or sys.stdout, tail,
                                                   b"stdout", options.timestamps)),
             threading.Thread(target=_relay, args=(process.stderr, options.stderr or sys.stderr, tail,
                                                   b"stderr", options.timestamps))]
    for pump in pumps:
        pump.start()
    code = process.wait()
    for pump in pumps:
        pump.join()
    return code, list(tail)


def horovod_tagged(line: bytes, kind: bytes, timestamp: bool = False) -> bytes:
    """A rank's line as Horovod's Spark and Ray jobs tag it: ``[0]<stdout>:text`` where hvdliterun
    writes ``[0]: text``, after the local time (``time.asctime()``) if ``timestamp``; other lines as
    they are."""
    when = time.asctime().encode() if timestamp else b""
    return _RANK_TAG.sub(lambda match: b"%s[%s]<%s>:" % (when, match.group(1), kind), line, count=1)


_RANK_TAG = re.compile(rb"^\[(\d+)\]: ")


def _relay(stream: IO[bytes], sink: IO[str], tail: collections.deque[str], kind: bytes, timestamps: bool) -> None:
    for line in iter(stream.readline, b""):
        text = horovod_tagged(line, kind, timestamps).decode(errors="replace")
        tail.append(text.rstrip("\n"))
        sink.write(text)
        sink.flush()


def finish_tasks(addresses: Sequence[Address], key: bytes, timeout: float = FINISH_SECONDS) -> list[int]:
    """Tell every task the job is over, all at once; the indices of those that heard it within
    ``timeout`` s. The others are gone, or hung: a task whose process stopped (its executor paused,
    its node unreachable) still takes the connection in the kernel and would never answer."""
    reached: list[int] = []
    lock = threading.Lock()

    def tell(index: int, address: Address) -> None:
        try:
            request(address, key, ("finish",))
        except (OSError, EOFError):
            return
        with lock:
            reached.append(index)

    # Daemon threads: one still waiting on a hung task must not hold the driver at exit.
    threads = [threading.Thread(target=tell, args=item, daemon=True, name=f"finish-task-{item[0]}")
               for item in enumerate(addresses)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    with lock:
        return sorted(reached)


def results_by_rank(outcomes: Sequence[TaskOutcome], code: int, tail: Sequence[str]) -> list[Any]:
    """Every rank's return value, in rank order; a :class:`RemoteJobError` if any rank has none."""
    missing = [outcome for outcome in outcomes if not outcome.ok]
    if not missing and code == 0:
        return [cloudpickle.loads(outcome.value) for outcome in outcomes]
    output = "\n".join(tail)
    if not missing:
        raise RemoteJobError(f"every rank returned, but the MPI job exited with code {code}; its last output:\n"
                             f"{output}")
    # The rank that raised says most, then one whose task died; the others usually died with the job.
    first = min(missing, key=lambda outcome: (not outcome.reported, not outcome.lost, outcome.index))
    others = ", ".join(str(outcome.index) for outcome in missing if outcome is not first)
    also = f" (ranks without a result as well: {others})" if others else ""
    if first.reported:
        raise RemoteJobError(f"rank {first.index} failed{also}:\n{first.error}")
    raise RemoteJobError(f"rank {first.index} has no result: {first.error}{also}; the MPI job exited with code "
                         f"{code}; its last output:\n{output}")
