"""What a submitted operation is: its negotiable description, its local buffers, and its handle."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import HvdliteError
from .ops import Collective, ReduceOp


@dataclasses.dataclass(frozen=True)
class RequestMeta:
    """Everything other ranks must agree on for one named request. Sent to the coordinator.

    ``signature`` (all fields but the rank) is the response-cache key: a rank hits the cache
    only if it submits exactly what it submitted when the entry was made.
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

    @property
    def signature(self) -> tuple[Any, ...]:
        # Spelled out: dataclasses.astuple deep-copies and was a hot spot (called per request per cycle).
        return (self.name, self.collective, self.dtype, self.shape, self.op, self.prescale, self.postscale,
                self.root_rank, self.splits)


class Handle:
    """An in-flight operation. ``poll()`` / ``synchronize()`` in the public API take it."""

    __slots__ = ("name", "_done", "_result", "_error")

    def __init__(self, name: str) -> None:
        self.name = name
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        """True once the result (or an error) is ready; never blocks."""
        return self._done.is_set()

    def set_result(self, result: Any) -> None:
        self._result = result
        self._done.set()

    def set_error(self, error: BaseException) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until done; return the result or raise the operation's error."""
        deadline = None if timeout is None else time.monotonic() + timeout
        # Waiting in short slices keeps Ctrl-C responsive in the main thread.
        while not self._done.wait(0.5):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"operation {self.name!r} did not finish within {timeout} s")
        if self._error is not None:
            error = self._error
            if isinstance(error, HvdliteError):
                # A fresh instance so the traceback shows the caller, not the engine thread.
                raise type(error)(str(error)) from error
            raise error
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

    def wait(self, timeout: float | None = None) -> Any:
        if not self._converted:
            self._value = self._convert(self._inner.wait(timeout))
            self._converted = True
        return self._value

    def __repr__(self) -> str:
        return f"<hvdlite Handle {self.name!r} {'done' if self.done() else 'pending'}>"


@dataclasses.dataclass
class Request:
    """One rank's submission: the meta it negotiates, its input, and where the result goes."""

    meta: RequestMeta
    tensor: np.ndarray | None
    handle: Handle
    # Where the result is written (in-place forms); None means a fresh array. May be ``tensor`` itself.
    output: np.ndarray | None = None
    submitted_at: float = dataclasses.field(default_factory=time.monotonic)
    # Once sent to the coordinator, the request waits for its round's response, never for a cache bit.
    sent_to_coordinator: bool = False
