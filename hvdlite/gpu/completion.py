"""When a device collective's result may be used: stream-ordered (asynchronous) completion.

A collective on the NCCL plane is enqueued on the plane's CUDA stream, followed by a *completion
event*. With asynchronous completion (``HVDLITE_ASYNC_COMPLETION=1``, the default; Horovod's
``HOROVOD_ENABLE_ASYNC_COMPLETION``) its handle completes as soon as the work is enqueued, and
waiting on the handle costs no host synchronization: for torch tensors the caller's *current
stream* waits for the event (:meth:`Completion.consume`), as torch's own NCCL process group does,
so everything the caller enqueues afterwards sees the result and the host runs ahead of the GPU.
Frameworks that give the core no stream (JAX, TensorFlow) get a host wait on the event instead,
so their results are complete when ``synchronize`` returns, as before.

The plane keeps each collective's inputs alive until its event has fired (:class:`InFlight`): the
framework's caching allocator must not hand their memory to new tensors while NCCL still reads it.
The same bookkeeping watches the deadline and NCCL's asynchronous error of work in flight, so a
dead peer ends in an error within ``HVDLITE_COMM_TIMEOUT_SECONDS``, never in a stream that waits
forever.

Events come from a per-device pool (:class:`Event`, given back when the last reference goes), recorded and waited on
through cupy's thin runtime bindings: this is the per-operation hot path of every GPU collective.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

from ..errors import CommTimeoutError, DeviceError
from ..utils.polling import WaitTimeout, wait_until

# A host wait spins this long (a small collective is done within it), then sleeps with backoff:
# a rank waiting for a long GPU queue costs a few percent of a core, not a spinning one.
HOST_SPIN_SECONDS = 200e-6
# Work in flight this briefly is not asked about NCCL's error (a call into NCCL, every cycle): a failed
# peer shows only after the work waited on it, and the deadline counts in seconds.
QUIET_SECONDS = 0.05
CurrentStream = Callable[[int], int]  # device id -> the calling thread's current CUDA stream (a framework's)


_DISABLE_TIMING = 0x2  # cudaEventDisableTiming: the cheapest event to record and query
_NOT_READY = 600  # cudaErrorNotReady
_monotonic = time.monotonic  # looked up once: every blocking GPU collective adds an entry in flight
_POOLS: dict[int, list[int]] = {}  # device id -> CUDA events no Event object refers to any more
# Work in flight with nothing to release is reaped in batches of this many (or once QUIET_SECONDS old):
# events fire in launch order, so one query of the newest clears a batch (see InFlight.check).
REAP_BATCH = 64
_runtime: Any = None  # cupy.cuda.runtime, bound by the first event made: every call below has an event


def _cuda() -> Any:
    global _runtime
    import cupy

    _runtime = cupy.cuda.runtime
    return _runtime


class Event:
    """A CUDA event (no timing) taken from a per-device pool, and given back when its last reference
    goes: every device collective records two, and creating a CUDA event costs more than recording one.

    Recycling is safe then: nothing can wait on an event nobody refers to, and re-recording an event
    leaves the waits enqueued before unaffected (CUDA captures the event's state at each wait).
    """

    __slots__ = ("ptr", "device_id")

    def __init__(self, device_id: int) -> None:
        pool = _POOLS.get(device_id)
        if pool:
            self.ptr = pool.pop()
        else:
            self.ptr = _create_event(device_id)
            if pool is None:
                _POOLS[device_id] = []
        self.device_id = device_id

    def __del__(self) -> None:
        try:
            _POOLS[self.device_id].append(self.ptr)  # made when its first event was
        except (AttributeError, TypeError, KeyError):  # interpreter shutdown: module globals are gone
            pass

    @property
    def done(self) -> bool:
        """True once the work recorded before the event finished (never blocks)."""
        runtime = _runtime or _cuda()
        status = runtime.eventQuery(self.ptr)
        if status == 0:
            return True
        if status == _NOT_READY:
            return False
        raise DeviceError(f"CUDA error {status} on GPU {self.device_id} while waiting for device work "
                          f"({runtime.getErrorString(status).decode(errors='replace')})")


def _create_event(device_id: int) -> int:
    runtime = _cuda()
    previous = runtime.getDevice()
    if previous == device_id:
        return runtime.eventCreateWithFlags(_DISABLE_TIMING)
    runtime.setDevice(device_id)
    try:
        return runtime.eventCreateWithFlags(_DISABLE_TIMING)
    finally:
        runtime.setDevice(previous)


def new_event(device_id: int) -> Event:
    """An event on ``device_id``, from the pool."""
    return Event(device_id)


def record(event: Any, stream_ptr: int) -> Any:
    """Record ``event`` on the stream ``stream_ptr`` (a raw pointer: no stream object is built)."""
    (_runtime or _cuda()).eventRecord(event.ptr, stream_ptr)
    return event


def stream_waits(stream_ptr: int, event: Any) -> None:
    """Work enqueued on ``stream_ptr`` from now on waits for ``event``."""
    (_runtime or _cuda()).streamWaitEvent(stream_ptr, event.ptr, 0)


def host_wait(event: Any, timeout: float | None, max_sleep: float, what: str) -> None:
    """Block until ``event`` fired: a short spin, then sleeps backing off up to ``max_sleep``."""
    try:
        wait_until(lambda: event.done, HOST_SPIN_SECONDS, max_sleep, timeout)
    except WaitTimeout as exc:
        raise CommTimeoutError(f"{what} did not finish on the GPU within {exc.seconds:g} s") from None


class Completion:
    """What waiting on a device collective's handle does (see the module docstring)."""

    __slots__ = ("event", "device_id", "current_stream", "timeout", "max_sleep", "meta", "keep", "source_stream")

    def __init__(self, event: Any, device_id: int, current_stream: CurrentStream | None, timeout: float | None,
                 max_sleep: float, meta: Any, keep: Any = None, source_stream: int | None = None) -> None:
        self.event = event
        self.device_id = device_id
        self.current_stream = current_stream  # None: the framework has no streams, the host waits
        self.timeout = timeout
        self.max_sleep = max_sleep
        self.meta = meta  # the request's RequestMeta: named in a timeout's message
        # The request's device memory (input, output), held until the caller is ordered after the
        # collective: from then on the framework's allocator reuses it only behind the collective.
        self.keep = keep
        self.source_stream = source_stream  # the stream the input was submitted from

    def consume(self) -> None:
        """Order the caller after the collective: its current stream waits, or its thread does.

        Then the memory is released when that is safe: after a host wait; after a stream wait on
        the stream the tensor was submitted from (torch's caching allocator hands a freed block
        only to work on the stream it belongs to, which now waits for the collective). Waited on
        another stream, it stays held until the plane sees the event fired.
        """
        if self.current_stream is not None:
            stream = self.current_stream(self.device_id)
            stream_waits(stream, self.event)
            if stream == self.source_stream:
                self.keep = None
        else:
            what = f"{self.meta.collective.name.lower()} of {self.meta.name!r}"
            host_wait(self.event, self.timeout, self.max_sleep, what)
            self.keep = None

    @property
    def done(self) -> bool:
        """True once the collective finished on the GPU."""
        return self.event.done


class InFlight:
    """Device work enqueued and not yet seen finished, oldest first: what it holds alive, and since when.

    ``failure()`` is NCCL's asynchronous error ('' if none), asked only while work is in flight;
    ``describe(what)`` names an entry's work in an error (built only then: this runs per operation).
    """

    def __init__(self, failure: Callable[[], str], timeout: float | None,
                 describe: Callable[[Any], str] = str) -> None:
        self._failure = failure
        self._timeout = timeout
        self._describe = describe
        self._entries: collections.deque[tuple[Any, Any, Any, float]] = collections.deque()
        self._holding = 0  # entries that hold memory to release

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, event: Any, keep_alive: Any, what: Any) -> int:
        """Track ``event``; ``keep_alive`` (the requests, hence their tensors) is dropped once it fired.
        Returns how many entries are in flight now."""
        entries = self._entries
        entries.append((event, keep_alive, what, _monotonic()))
        if keep_alive:
            self._holding += 1
        return len(entries)

    def reap(self) -> None:
        """Drop every entry whose event fired, oldest first.

        Events fire in launch order (a launch on another stream waits for the previous launch's
        event), so when no entry holds memory, one query of the newest clears them all.
        """
        entries = self._entries
        if not self._holding and len(entries) > 1 and entries[-1][0].done:
            entries.clear()
            return
        while entries and entries[0][0].done:
            if entries.popleft()[1]:
                self._holding -= 1

    def check(self) -> str:
        """Reap, then describe why the oldest entry can never finish ('' while all is well): NCCL
        reported an error, or it has been in flight longer than the deadline.

        Entries that hold nothing (a blocking call's, on its caller's stream) are reaped only in
        batches of :data:`REAP_BATCH`, or once the oldest is :data:`QUIET_SECONDS` old: this runs
        every cycle, and asking CUDA about each blocking call's event was a share of its cost.
        """
        entries = self._entries
        if not entries:
            return ""
        since = entries[0][3]
        waited = time.monotonic() - since
        if not self._holding and waited < QUIET_SECONDS and len(entries) < REAP_BATCH:
            return ""
        self.reap()
        if not entries:
            return ""
        _, _, work, since = entries[0]
        waited = time.monotonic() - since
        if waited < QUIET_SECONDS:
            return ""
        what = self._describe(work)
        failure = self._failure()
        if failure:
            return f"NCCL failed during {what}: {failure}"
        if self._timeout is not None and waited > self._timeout:
            return (f"{what} has not finished on the GPU after {waited:.0f} s (HVDLITE_COMM_TIMEOUT_SECONDS="
                    f"{self._timeout:g}): a peer stopped taking part")
        return ""

    def drain(self, max_sleep: float) -> None:
        """Wait (bounded by the deadline) until everything in flight finished; for shutdown."""
        while self._entries:
            event, _, work, _ = self._entries[-1]
            host_wait(event, self._timeout, max_sleep, self._describe(work))
            self.reap()
