"""The timeline: a Chrome trace-event JSON file of what happened to every tensor, on rank 0.

Open it in Perfetto (ui.perfetto.dev) or chrome://tracing. Each tensor is one row, named as Horovod
names it, ``<op>.<name>`` (``allreduce.loss``; a generated name, ``allreduce.noname.3``, carries
its op already), so tools written for Horovod's timelines read it. A row shows ``NEGOTIATE_<OP>`` from the moment the tensor was submitted until every rank agreed to run
it, with an instant event per rank when the coordinator learned that rank was ready (only rounds
that went through the coordinator know this; requests answered by the response cache are agreed
in one bit-vector all-reduce, so all ranks are ready together), then ``<OP>`` while it was
executed, with the size and the number of tensors fused with it (hvdlite's detail beside Horovod's
events). ``mark_cycles`` adds a ``CYCLE_START`` instant event per engine cycle that did work. A process set that includes rank 0 records into the same
file through :meth:`Timeline.scoped`: its rows are named ``process set <id>: <tensor>`` and its
ready events name ranks of the job (as in Horovod, sets without rank 0 are not recorded).

The file is valid JSON after every write, not only after ``close()``: events are written where
the closing bracket was, followed by a new one, so a job that dies leaves a readable file.
Horovod's timeline had the same purpose but stays unterminated until its writer closes.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..work.request import RequestMeta
    from ..work.scope import Scope


def row_name(meta: RequestMeta) -> str:
    """Horovod's row for a tensor: ``<op>.<name>``; a generated name starts with its op already."""
    op = meta.collective.name.lower()
    return meta.name if meta.name.startswith(op + ".") else f"{op}.{meta.name}"


class Timeline:
    """Appends trace events to ``path``; engine threads (one per communicator) record, any thread may close."""

    def __init__(self, path: str, rank: int, mark_cycles: bool = False) -> None:
        self.path = path
        self.mark_cycles = mark_cycles
        self._rank = rank
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._rows: dict[str, int] = {}
        self._buffered: list[dict] = []
        self._handle = open(path, "w+b")  # noqa: SIM115 - kept open for the timeline's life
        self._handle.write(b"[\n")
        self._end = self._handle.tell()  # where the next event goes; the closing bracket sits here
        self._empty = True
        self._emit({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}})
        self.flush()

    @property
    def start_time(self) -> float:
        """The ``time.monotonic()`` value that is time 0 in the file (to align other records with it)."""
        return self._start

    def _ts(self, when: float) -> float:
        return round((when - self._start) * 1e6, 3)

    def _row(self, name: str) -> int:
        row = self._rows.get(name)
        if row is None:
            with self._lock:  # process sets' engine threads add rows too
                row = self._rows.get(name) or len(self._rows) + 1
                if name not in self._rows:
                    self._rows[name] = row
                    self._buffered.append({"name": "thread_name", "ph": "M", "pid": self._rank, "tid": row,
                                           "args": {"name": name}})
        return row

    def _emit(self, event: dict) -> None:
        self._buffered.append(event)  # atomic; flush() swaps the list under the lock

    def scoped(self, scope: Scope) -> ScopedTimeline:
        """The view a process set's engine records through (``scope``: the set's id and members)."""
        return ScopedTimeline(self, scope)

    # ---- what the engine records ---------------------------------------------------------------
    def begin(self, name: str, activity: str, when: float, args: dict | None = None) -> None:
        """``activity`` starts on ``name``'s row at monotonic time ``when``."""
        event = {"name": activity, "ph": "B", "ts": self._ts(when), "pid": self._rank, "tid": self._row(name)}
        if args:
            event["args"] = args
        self._emit(event)

    def end(self, name: str, when: float, args: dict | None = None) -> None:
        """The innermost open activity on ``name``'s row ends."""
        event = {"ph": "E", "ts": self._ts(when), "pid": self._rank, "tid": self._row(name)}
        if args:
            event["args"] = args
        self._emit(event)

    def instant(self, name: str, label: str, when: float) -> None:
        """A point event on ``name``'s row (e.g. which rank became ready)."""
        self._emit({"name": label, "ph": "i", "s": "t", "ts": self._ts(when), "pid": self._rank,
                    "tid": self._row(name)})

    def negotiated(self, names: list[str], ready: dict[str, dict[int, float]], when: float) -> None:
        """End the negotiation of ``names``; ``ready`` (rank 0's coordinator) says when each rank was ready."""
        for name in names:
            for rank, at in sorted(ready.get(name, {}).items(), key=lambda item: item[1]):
                self.instant(name, f"rank {rank} ready", at)
            self.end(name, when)

    def cycle(self, when: float) -> None:
        self._emit({"name": "CYCLE_START", "ph": "i", "s": "p", "ts": self._ts(when), "pid": self._rank, "tid": 0})

    # ---- writing ---------------------------------------------------------------------------------
    def flush(self) -> None:
        """Write the buffered events; afterwards the file is a complete JSON array."""
        with self._lock:
            if not self._buffered or self._handle.closed:
                return
            events, self._buffered = self._buffered, []
            text = ",\n".join(json.dumps(e, separators=(",", ":")) for e in events)
            body = (("" if self._empty else ",\n") + text).encode()
            self._empty = False
            self._handle.seek(self._end)
            self._handle.write(body + b"\n]\n")
            self._end += len(body)
            self._handle.flush()

    def close(self) -> None:
        self.flush()
        with self._lock:
            if not self._handle.closed:
                os.fsync(self._handle.fileno())
                self._handle.close()


class ScopedTimeline:
    """A process set's view of a :class:`Timeline`: rows prefixed with the set, ranks of the job."""

    def __init__(self, timeline: Timeline, scope: Scope) -> None:
        self.timeline, self._scope = timeline, scope
        self._prefix = scope.row_prefix
        self.mark_cycles = timeline.mark_cycles

    def begin(self, name: str, activity: str, when: float, args: dict | None = None) -> None:
        self.timeline.begin(self._prefix + name, activity, when, args)

    def end(self, name: str, when: float, args: dict | None = None) -> None:
        self.timeline.end(self._prefix + name, when, args)

    def negotiated(self, names: list[str], ready: dict[str, dict[int, float]], when: float) -> None:
        job = self._scope.job_rank
        self.timeline.negotiated([self._prefix + n for n in names],
                                 {self._prefix + n: {job(r): at for r, at in by_rank.items()}
                                  for n, by_rank in ready.items()}, when)

    def cycle(self, when: float) -> None:
        self.timeline.cycle(when)

    def flush(self) -> None:
        self.timeline.flush()
