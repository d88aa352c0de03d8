"""Running the mpiexec process: output passthrough, signal forwarding, naming a killed rank."""

from __future__ import annotations

import ctypes
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time

from .cluster.pid_files import local_pids, read_pid_files
from .elastic.watch import ElasticWatch
from .leftovers import remove_leftover_segments, segments
from .tagging import LineTagger

_KILLED_PID = re.compile(r"PID (\d+) RUNNING AT (\S+)")
_GRACE_SECONDS = 5.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


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


class FirstExitWatcher:
    """Notices which rank's process ended first, so a failed job can name it.

    MPI's own report names a PID that may belong to a rank it killed during clean-up.
    """

    def __init__(self, run_dir: str) -> None:
        self._run_dir = run_dir
        self.first: list[tuple[int, int]] = []  # (rank, pid) of the first ranks seen gone
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        # pidfds wake us the moment a rank's process ends (they work for non-child processes),
        # so the first rank to end is told apart from the ranks MPI kills a few ms later.
        poller = select.poll()
        fds: dict[int, tuple[int, int]] = {}
        watched: set[int] = set()
        while not self._stop.is_set():
            gone: list[tuple[int, int]] = []
            for rank, pid in local_pids(self._run_dir).items():
                if rank in watched:
                    continue
                watched.add(rank)
                try:
                    fd = os.pidfd_open(pid)
                except OSError:  # already gone before we looked
                    gone.append((rank, pid))
                    continue
                fds[fd] = (rank, pid)
                poller.register(fd, select.POLLIN)
            # A watcher that looked late (a busy machine) may find several ranks ended, some reaped and
            # some still zombies: all of them count as seen at once, never just the reaped ones.
            ready = poller.poll(0 if gone else 20)
            gone += [fds[fd] for fd, _ in ready]
            if gone:
                # A rank already inside exit() may end after others that died later (seen: a killed
                # rank tearing down its memory while MPI's clean-up killed the rest): it ended with them.
                gone += [item for item in fds.values() if item not in gone and dying(item[1])]
                self.first = sorted(gone, key=lambda item: (isinstance(item[0], str), item[0]))
                break
        for fd in fds:
            os.close(fd)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(1)


def run(argv: list[str], env: dict[str, str], run_dir: str, all_local: bool = True, elastic_np: int = 0) -> int:
    """Run ``argv``; forward SIGINT/SIGTERM to the whole job (unless started ignored); return its exit code.

    ``all_local``: every rank runs on this host, so the first rank seen ending here is the
    first in the job (with remote hosts it may not be, and only MPI's report is quoted).
    ``elastic_np``: elastic mode with this many ranks; the job's code is then its survivors'.
    """
    segments_before = segments()
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True, preexec_fn=die_with_parent)
    seen: list[str] = []
    pumps = [threading.Thread(target=_pump, args=(process.stdout, sys.stdout, seen), daemon=True),
             threading.Thread(target=_pump, args=(process.stderr, sys.stderr, seen), daemon=True)]
    for pump in pumps:
        pump.start()
    stopping: list[float] = []  # when a signal (or the elastic watch) began to stop the job
    watcher = FirstExitWatcher(run_dir)
    elastic = ElasticWatch(run_dir, elastic_np, _GRACE_SECONDS, lambda: _signal_group(process, signal.SIGKILL)) \
        if elastic_np else None
    _wait_forwarding_signals(process, stopping, elastic)
    for pump in pumps:
        pump.join(timeout=5)
    _signal_group(process, signal.SIGKILL)
    code = process.returncode
    watcher.stop()
    _reap_ranks(local_pids(run_dir))  # ranks run in sessions of their own: end stragglers by pid
    remove_leftover_segments(segments_before)
    if elastic is not None and not stopping:
        code = elastic.exit_code(code)
    if code != 0 and not stopping:
        _report_failed_rank(watcher.first if all_local else [], seen, read_pid_files(run_dir))
    if stopping:
        return 130 if code in (0, None) else (code if code > 0 else 128 - code)
    return code if code >= 0 else 128 - code


def _wait_forwarding_signals(process: subprocess.Popen, stopping: list[float], elastic: ElasticWatch | None) -> None:
    """Wait for mpiexec to end, passing SIGINT/SIGTERM on to the job and killing it after the grace period."""
    def forward(signum: int, _frame) -> None:
        if not stopping:
            stopping.append(time.monotonic())
            sys.stderr.write(f"hvdliterun: got {signal.Signals(signum).name}; stopping every rank\n")
            _signal_group(process, signal.SIGINT)

    # A signal this process started with ignored stays ignored (a shell's background job ignores SIGINT).
    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        while process.poll() is None:
            if stopping and time.monotonic() - stopping[0] > _GRACE_SECONDS:
                _signal_group(process, signal.SIGKILL)
            if elastic is not None:
                elastic.look(stopping)
            time.sleep(0.05)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def die_with_parent() -> None:
    """In a child, before it starts (mpiexec, a remote proxy): the kernel SIGKILLs it when the thread
    that started it ends (hvdliterun, or the Spark task or Ray actor serving it): no orphaned job."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


_PF_EXITING = 0x4  # /proc/PID/stat flags: the process is inside exit()


def dying(pid: int) -> bool:
    """True if ``pid`` is inside exit() or already gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError, ValueError):
        return True
    return fields[0] in "ZX" or bool(int(fields[6]) & _PF_EXITING)


def alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie, dead but not yet reaped by its parent, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _reap_ranks(pids: dict[int | str, int], grace: float = 2.0) -> None:
    """Give local ranks ``grace`` seconds to exit after mpiexec did, then kill them: no orphans."""
    deadline = time.monotonic() + grace
    while any(alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for rank, pid in pids.items():
        if alive(pid):
            sys.stderr.write(f"hvdliterun: rank {rank} (pid {pid}) outlived mpiexec; killing it\n")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _report_failed_rank(first: list[tuple[int, int]], lines: list[str],
                        known: dict[int, tuple[int, str]] | None = None) -> None:
    """Name the rank that ended first, or, when that is not known, the one MPI reports.

    ``first``: the (rank, pid) pairs seen ending first on this host, when every rank is local.
    ``known``: every pid file found, ``{rank: (pid, host)}``, to put a rank to MPI's pid and host.
    """
    if len(first) == 1:
        rank, pid = first[0]
        sys.stderr.write(f"hvdliterun: rank {rank} (pid {pid}) was the first rank to end; the job failed\n")
        return
    for line in lines:  # no single first rank seen: fall back to MPI's report
        match = _KILLED_PID.search(line)
        if not match:
            continue
        pid, host = int(match.group(1)), match.group(2)
        # MPI's report may name a rank it killed itself while cleaning up (seen in CI: rank 1 killed,
        # MPI reported rank 0; across hosts, rank 3 killed, rank 2 reported), so it comes with a caveat.
        caveat = "(it may name a rank it killed while cleaning up; the ranks' own output says more)"
        named = [rank for rank, seen in first if seen == pid]
        if named:  # say which rank MPI means, without claiming to know it ended first
            sys.stderr.write(f"hvdliterun: ranks {[rank for rank, _ in first]} ended before hvdliterun could "
                             f"tell them apart; MPI reports rank {named[0]} (pid {pid}) terminated "
                             f"abnormally {caveat}; the job failed\n")
            return
        named = [rank for rank, found in (known or {}).items() if found == (pid, host)]
        who = f"rank {named[0]} (pid {pid} on {host})" if named else f"pid {pid} on {host}"
        sys.stderr.write(f"hvdliterun: MPI reports {who} terminated abnormally {caveat}; the job failed\n")
        return
