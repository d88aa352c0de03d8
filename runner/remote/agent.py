"""Hydra's remote-start program for a remote job: ``agent RUN_DIR [ssh options] HOST COMMAND...``.

Hydra (``-launcher ssh -launcher-exec``) calls it as it would call ssh, once per host of the job;
the hosts are the aliases the driver wrote into ``RUN_DIR/tasks.json`` (``task-0`` -> the task
service's address). The agent has that task run the command, relays its output, and exits with
its exit code, as ssh does. The driver writes a small script that calls this module with its
run directory first.
"""

from __future__ import annotations

import json
import os
import sys

from .wire import connect

TASKS_FILE = "tasks.json"
KEY_FILE = "key"


def split_arguments(argv: list[str]) -> tuple[str, str]:
    """(host, command) from ssh-style arguments: options (Hydra passes ``-x``) come first."""
    rest = list(argv)
    while rest and rest[0].startswith("-"):
        rest.pop(0)
    if len(rest) < 2:
        raise ValueError(f"expected [options] HOST COMMAND..., got {argv!r}")
    return rest[0], " ".join(rest[1:])


def run_on_task(run_dir: str, host: str, command: str) -> int:
    """Run ``command`` on the task named ``host``; its output goes to ours; returns its exit code."""
    with open(os.path.join(run_dir, TASKS_FILE)) as handle:
        tasks = json.load(handle)
    with open(os.path.join(run_dir, KEY_FILE), "rb") as handle:
        key = handle.read()
    if host not in tasks:
        print(f"hvdlite remote agent: no task named {host!r} (known: {sorted(tasks)})", file=sys.stderr)
        return 255
    with connect(tuple(tasks[host]), key) as connection:
        connection.send(("run", command))
        while True:
            try:
                kind, data = connection.recv()
            except EOFError:  # the task died: ssh's code for a lost connection
                return 255
            if kind == "exit":
                return data
            sink = sys.stdout if kind == "out" else sys.stderr
            sink.buffer.write(data)
            sink.flush()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    host, command = split_arguments(argv[1:])
    return run_on_task(argv[0], host, command)


if __name__ == "__main__":
    sys.exit(main())
