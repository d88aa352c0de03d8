"""c10d ``Work`` over hvdlite handles: what torch waits on, and the future DDP's hooks chain on.

A collective of the process group submits one or more core operations and returns an
:class:`HvdliteWork`. The work finishes when every operation is delivered: it then runs its
``finish`` step once (copy results into the tensors torch passed in, where the core did not write
them in place) and completes its future. Completion happens on the thread that delivers the last
operation (usually the engine's), so a future completes without anybody calling ``wait()``, as
gloo's and NCCL's do; ``wait()`` completes it on the caller's thread if that comes first.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ...core.runtime import current, is_initialized
from ...core.work.request import Handle


def core_handles(handle: Any) -> list[Handle]:
    """The core's handles behind an adapter's handle (mapped, grouped or plain)."""
    if isinstance(handle, list):  # GroupHandle
        return [inner for member in handle for inner in core_handles(member)]
    inner = getattr(handle, "_inner", None)
    return core_handles(inner) if inner is not None else [handle]


class HvdliteWork(dist.Work):
    """The work of one c10d call: ``handles`` (adapter handles, waited on in order) and ``finish``
    (given their results, writes torch's outputs and returns the future's value)."""

    def __init__(self, handles: Sequence[Any], finish: Callable[[list[Any]], Any]) -> None:
        super().__init__()
        self._handles = list(handles)
        self._finish = finish
        self._lock = threading.Lock()
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None
        self._source: torch.futures.Future | None = None  # completed here with (value, error)
        self._future: torch.futures.Future | None = None  # what torch gets: chained on _source
        self._pending = 0

    @staticmethod
    def completed(value: Any = None) -> CompletedWork:
        """A work that finished already (a call that ran at once, or had nothing to exchange)."""
        return CompletedWork(value)

    # ---- completion ----------------------------------------------------------------------------
    def _complete(self) -> None:
        """Wait for the handles (delivered already when called from a callback), finish once.

        The waits run outside the lock: the engine thread takes it to count deliveries, and a
        caller holding it while waiting would keep the engine from delivering the rest."""
        if not self._done:
            for handle in self._handles:
                handle.join()
        with self._lock:
            if self._done:
                return
            try:
                self._value = self._finish([handle.wait() for handle in self._handles])
            except BaseException as error:  # noqa: BLE001 - handed to the waiter and the future
                self._error = error
            self._done = True
            source = self._source
        if source is not None:
            source.set_result((self._value, self._error))

    def _on_delivered(self, handle: Handle) -> None:
        with self._lock:
            self._pending -= 1
            last = self._pending == 0
        if last:
            self._complete()

    # ---- torch's Work interface ----------------------------------------------------------------
    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until done; raise the operation's error (hvdlite's, naming tensors and ranks)."""
        self._complete()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done or all(handle.done() for handle in self._handles)

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> Any:
        self.wait()
        return self._value

    def get_future(self) -> torch.futures.Future:
        """A future that completes (with the output tensors) when the operation does."""
        with self._lock:
            if self._future is not None:
                return self._future
            # An error must reach C++ readers (DDP's reducer) as an error: a Python future's
            # set_exception stores the exception as its *value*, which they read as tensors (a
            # segfault). An exception raised in a ``then`` callback is stored as an error.
            source = self._source = torch.futures.Future()
            future = self._future = source.then(_unwrap)
            if self._done:
                source.set_result((self._value, self._error))
                return future
            inner = [h for handle in self._handles for h in core_handles(handle)]
            self._pending = len(inner)
        if not inner:
            self._complete()
        for handle in inner:
            handle.add_done_callback(self._on_delivered)
        waiter = _waiter()
        if waiter is not None:
            waiter.put(self)
        return future


class CompletedWork(dist.Work):
    """The work of a call that finished before it was returned (``value``: its future's). Made on
    every blocking small call, so it holds nothing an unfinished work needs."""

    def __init__(self, value: Any = None) -> None:
        super().__init__()
        self._value = value

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> BaseException | None:
        return None

    def result(self) -> Any:
        return self._value

    def get_future(self) -> torch.futures.Future:
        future = torch.futures.Future()
        future.set_result(self._value)
        return future


class _FutureWaiter:
    """A thread that waits on works whose futures torch waits on in C++ (DDP's reducer).

    A Python caller that waits on a handle runs the engine's cycles itself at its own priority
    (:meth:`hvdlite.core.engine.Engine.drive`); torch's C++ wait cannot, which leaves the cycles to
    the engine thread, at its low priority. Where a host runs more ranks than it has cores, that
    thread waits behind the other ranks' computation (DDP at np=3 on 2 cores: 1.3x gloo's step). This
    thread then waits in torch's place, at the normal priority, in submission order (0.9-1.2x). With
    a core per rank it only costs (0.8x instead of 0.67x gloo's step at np=2 on 2 cores): not used.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[HvdliteWork] = queue.SimpleQueue()
        threading.Thread(target=self._run, daemon=True, name="hvdlite-c10d-futures").start()

    def put(self, work: HvdliteWork) -> None:
        self._queue.put(work)

    def _run(self) -> None:
        while True:
            self._queue.get()._complete()


_WAITER: _FutureWaiter | None = None
_WAITER_DECIDED = False


def _waiter() -> _FutureWaiter | None:
    """The waiter thread, where this host's ranks outnumber its cores; else None."""
    global _WAITER, _WAITER_DECIDED
    if not _WAITER_DECIDED and is_initialized():  # (a work made without hvdlite running: tests)
        _WAITER_DECIDED = True
        if current().topology.outnumbers_cores():
            _WAITER = _FutureWaiter()
    return _WAITER


def _unwrap(source: torch.futures.Future) -> Any:
    """The work's value, or its error raised (which makes it the chained future's error)."""
    value, error = source.value()
    if error is not None:
        raise error
    return value
