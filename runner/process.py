"""Running the mpiexec process: output passthrough, signal forwarding, naming a killed rank."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

from .tagging import LineTagger

_KILLED_PID = re.compile(r"PID (\d+) RUNNING AT (\S+)")
_GRACE_SECONDS = 5.0


def _pump(stream, sink, seen: list[str]) -> None:
    tagger = LineTagger()
    for chunk in iter(lambda: stream.read1(65536), b""):
        text = tagger.feed(chunk)
        sink.buffer.write(text)
        sink.flush()
        if b"PID " in text:
            seen.append(text.decode(errors="replace"))
    sink.buffer.write(tagger.flush())
    sink.flush()


def rank_of_pid(run_dir: str, pid: int) -> int | None:
    """The rank whose pid file (written by ``hvdlite.init``) holds ``pid``."""
    try:
        names = os.listdir(run_dir)
    except OSError:
        return None
    for name in names:
        match = re.fullmatch(r"rank\.(\d+)\.pid", name)
        if match:
            with open(os.path.join(run_dir, name)) as handle:
                if handle.read().strip() == str(pid):
                    return int(match.group(1))
    return None


def run(argv: list[str], env: dict[str, str], run_dir: str) -> int:
    """Run ``argv``; forward SIGINT/SIGTERM to the whole job; return its exit code."""
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)
    seen: list[str] = []
    pumps = [threading.Thread(target=_pump, args=(process.stdout, sys.stdout, seen), daemon=True),
             threading.Thread(target=_pump, args=(process.stderr, sys.stderr, seen), daemon=True)]
    for pump in pumps:
        pump.start()
    stopping: list[float] = []

    def forward(signum: int, _frame) -> None:
        if not stopping:
            stopping.append(time.monotonic())
            sys.stderr.write(f"hvdliterun: got {signal.Signals(signum).name}; stopping every rank\n")
            _signal_group(process, signal.SIGINT)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while process.poll() is None:
            if stopping and time.monotonic() - stopping[0] > _GRACE_SECONDS:
                _signal_group(process, signal.SIGKILL)
            time.sleep(0.05)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    for pump in pumps:
        pump.join(timeout=5)
    _signal_group(process, signal.SIGKILL)  # nothing of the job may outlive the launcher
    code = process.returncode
    _report_killed_ranks(seen, run_dir)
    if stopping:
        return 130 if code in (0, None) else (code if code > 0 else 128 - code)
    return code if code >= 0 else 128 - code


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _report_killed_ranks(lines: list[str], run_dir: str) -> None:
    for line in lines:
        match = _KILLED_PID.search(line)
        if match:
            rank = rank_of_pid(run_dir, int(match.group(1)))
            who = f"rank {rank}" if rank is not None else "a rank that had not called hvdlite.init()"
            sys.stderr.write(f"hvdliterun: {who} (pid {match.group(1)} on {match.group(2)}) "
                             "terminated abnormally; the job was stopped\n")
