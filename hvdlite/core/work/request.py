"""What a submitted operation is: its negotiable description, its local buffers, and its handle."""

from __future__ import annotations

import _thread
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ...errors import HvdliteError
from ...ops import Collective, ReduceOp
from ...utils import dtypes


class RequestMeta(NamedTuple):
    """Everything other ranks must agree on for one named request. Sent to the coordinator.

    A tuple, so it is built and compared in C: the engine builds one per submitted tensor and
    compares it with the cached one every step. The whole tuple is the response-cache key
    (:attr:`signature`): a rank hits the cache only if it submits exactly what it submitted when
    the entry was made.
    """

    name: str
    collective: Collective
    dtype: str = ""
    shape: tuple[int, ...] = ()
    op: ReduceOp = ReduceOp.SUM
    prescale: float = 1.0
    postscale: float = 1.0
    root_rank: int = -1
    splits: tuple[int, ...] = ()
    device: str = "cpu"  # "cuda" for device memory; every rank must agree, as on dtype

    @property
    def signature(self) -> tuple[Any, ...]:
        return self


def checked_reduction(collective: Collective, array: Any, name: str, op: ReduceOp, prescale: float,
                      postscale: float, device: str = "cpu") -> RequestMeta:
    """The description of a reduction of ``array`` on ``device``; raises, naming the tensor, on a
    dtype, op or scale factor the core cannot reduce."""
    dtype = dtypes.dtype_name(array, name)
    dtypes.check_reduction(dtype, op, prescale, postscale, name)
    return RequestMeta(name, collective, dtype, tuple(array.shape), op, float(prescale), float(postscale),
                       device=device)


class Handle:
    """An in-flight operation. ``poll()`` / ``synchronize()`` in the public API take it.

    Completion is a flag plus, only if someone is already waiting, the release of that waiter's
    lock: a training step creates and completes a handle per gradient, and a ``threading.Event``
    per handle (a condition variable and a lock, built and notified) was measured as a visible
    share of that per-tensor cost. Correct under the GIL: the engine sets :attr:`delivered` before
    it reads ``_waiters``, and a waiter registers before it re-reads :attr:`delivered`.

    ``delivered`` (an attribute: the engine reads it after every cycle it runs for a waiter) is
    True once the engine handed over the result or error; a device result may still be in flight
    on the GPU then (:meth:`wait` orders the caller after it, :meth:`done` says when it finished).
    """

    __slots__ = ("name", "driver", "completion", "delivered", "_result", "_error", "_waiters", "_callbacks")

    def __init__(self, name: str) -> None:
        self.name = name
        # Set by the engine on submit: runs the engine's cycles on the waiting thread when it can.
        self.driver: Callable[[Handle], None] | None = None
        # Set by a device plane whose result is stream-ordered (hvdlite.gpu.completion.Completion):
        # each wait orders the waiter after the collective on the GPU.
        self.completion: Any = None
        self.delivered = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._waiters: list[_thread.LockType] = []
        self._callbacks: list[Callable[[Handle], None]] | None = None

    def add_done_callback(self, callback: Callable[[Handle], None]) -> None:
        """Call ``callback(self)`` once the result or error is delivered: on the engine thread that
        delivers it, or here if it was delivered already. Runs exactly once (a process group's
        futures complete this way, without a thread waiting for each operation)."""
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append(callback)
        if self.delivered:
            self._run_callbacks()

    def _run_callbacks(self) -> None:
        callbacks = self._callbacks
        while callbacks:
            try:
                callback = callbacks.pop(0)  # atomic under the GIL: each callback runs once
            except IndexError:
                return
            callback(self)

    def done(self) -> bool:
        """True once the result (or an error) is ready, on the GPU too; never blocks."""
        return self.delivered and (self.completion is None or self.completion.done)

    def set_result(self, result: Any) -> None:
        """Complete with ``result``; the first completion (result or error) wins."""
        if not self.delivered:
            self._result = result
            self._finish()

    def set_error(self, error: BaseException) -> None:
        """Complete with ``error``; the first completion (result or error) wins."""
        if not self.delivered:
            self._error = error
            self._finish()

    def _finish(self) -> None:
        self.delivered = True
        # Runs once per handle. A waiter that registers while this releases the others is released
        # too, harmlessly: it re-reads ``delivered`` before it blocks, and returns.
        for lock in self._waiters:
            lock.release()
        if self._callbacks:
            self._run_callbacks()

    def _block(self, timeout: float | None) -> None:
        if self.driver is not None and timeout is None:
            self.driver(self)  # returns once done, or with the engine thread woken to finish it
            if self.delivered:
                return
        lock = _thread.allocate_lock()
        lock.acquire()
        self._waiters.append(lock)
        deadline = None if timeout is None else time.monotonic() + timeout
        # Waiting in short slices keeps Ctrl-C responsive in the main thread.
        while not self.delivered and not lock.acquire(timeout=0.5):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"operation {self.name!r} did not finish within {timeout} s")

    def join(self) -> None:
        """Block until done, without returning the result or raising its error."""
        if not self.delivered:
            self._block(None)

    def wait(self, timeout: float | None = None) -> Any:
        """Block until done; return the result or raise the operation's error."""
        if not self.delivered:
            self._block(timeout)
        if self._error is not None:
            error = self._error
            if isinstance(error, HvdliteError):
                # A fresh instance so the traceback shows the caller, not the engine thread.
                raise type(error)(str(error)) from error
            raise error
        if self.completion is not None:
            self.completion.consume()
        return self._result

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<hvdlite Handle {self.name!r} {state}>"


class MappedHandle:
    """A handle whose result is converted once, on first wait (e.g. NumPy -> framework tensor).

    Adapters return these from their ``_async`` functions; the core's ``poll``/``synchronize``
    accept them like plain handles.
    """

    __slots__ = ("name", "_inner", "_convert", "_converted", "_value")

    def __init__(self, inner: Handle | MappedHandle, convert: Callable[[Any], Any]) -> None:
        self.name = inner.name
        self._inner = inner
        self._convert = convert
        self._converted = False
        self._value: Any = None

    def done(self) -> bool:
        return self._inner.done()

    def join(self) -> None:
        self._inner.join()

    def wait(self, timeout: float | None = None) -> Any:
        if not self._converted:
            self._value = self._convert(self._inner.wait(timeout))
            self._converted = True
        return self._value

    def __repr__(self) -> str:
        return f"<hvdlite Handle {self.name!r} {'done' if self.done() else 'pending'}>"


class GroupHandle(list):
    """The handles of a group's members, in order, that also act as one handle, as Horovod's
    grouped ``_async`` functions return: ``synchronize(group)`` gives the list of results and
    ``poll(group)`` is True once every member finished. Indexing and iterating give the members.
    """

    @property
    def name(self) -> str:
        return self[0].name if self else "empty group"

    def done(self) -> bool:
        return all(handle.done() for handle in self)

    def join(self) -> None:
        for handle in self:
            handle.join()

    def wait(self, timeout: float | None = None) -> list[Any]:
        """Every member's result, in order (``timeout`` applies to each wait)."""
        return [handle.wait(timeout) for handle in self]


class Request:
    """One rank's submission: the meta it negotiates, its input, and where the result goes.

    ``output`` is where the result is written (in-place forms); None means a fresh array, and it
    may be ``tensor`` itself. Once ``sent_to_coordinator``, the request waits for its round's
    response, never for a cache bit. A plain slotted class: one is built per tensor per step.
    """

    __slots__ = ("meta", "tensor", "handle", "output", "submitted_at", "sent_to_coordinator")

    def __init__(self, meta: RequestMeta, tensor: np.ndarray | None, handle: Handle,
                 output: np.ndarray | None = None, submitted_at: float | None = None) -> None:
        self.meta = meta
        self.tensor = tensor
        self.handle = handle
        self.output = output
        self.submitted_at = time.monotonic() if submitted_at is None else submitted_at
        self.sent_to_coordinator = False

    def __repr__(self) -> str:
        return f"Request({self.meta.name!r}, {self.meta.collective.name})"
