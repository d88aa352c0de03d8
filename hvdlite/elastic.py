"""Horovod's elastic state objects, for every framework: what a training loop commits and restores.

``state.commit()`` copies the tracked objects to host memory (and checks whether hosts were
updated); ``state.restore()`` brings back the last commit; ``state.sync()`` gives every rank rank
0's copy. :class:`ObjectState` tracks plain Python attributes; the adapters add handlers for models
and optimizers (``hvdlite.torch.elastic.TorchState``). ``run`` wraps a training function as
Horovod's ``hvd.elastic.run`` does.

In elastic mode (``hvdliterun --min-np N``, ``--max-np``, ``--host-discovery-script``) the survivors
of a rank's death re-form the job without it, and at a commit the job grows into free slots or lets
ranks go whose host left the list (:mod:`hvdlite.reform`). The README's "Elastic training" says
what is tested and what is not yet (issue #22).
"""

from __future__ import annotations

import copy
import functools
import queue
from collections.abc import Callable, Iterable
from typing import Any

from .errors import HorovodInternalError, HostsUpdatedInterrupt


class State:
    """State kept in step across ranks (Horovod's ``hvd.elastic.State``).

    ``bcast_object(obj)`` returns rank 0's ``obj`` on every rank; subclasses implement ``save``,
    ``restore`` and ``sync``.
    """

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages: queue.Queue[int] = queue.Queue()
        self._last_updated_timestamp = 0
        self._reset_callbacks: list[Callable[[], None]] = []
        self.pending_plan: Any = None  # the world change a commit agreed on, for run() to carry out

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Functions to call after the world changed (e.g. to rescale the learning rate to the new size)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self._host_messages = queue.Queue()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: int) -> None:
        """Record a host update (from the launcher); the next commit raises HostsUpdatedInterrupt."""
        self._host_messages.put(timestamp)

    def commit(self) -> None:
        """Save the tracked state to host memory, then check for host updates (a collective).

        Commits copy the whole state: commit every N batches rather than every batch, trading the
        copy's cost against the steps lost when a rank fails.
        """
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank at once if hosts were updated since the last check.

        In elastic mode rank 0 also plans the world's change (free slots to grow into, hosts that
        left the list); ``hvd.elastic.run`` carries it out.
        """
        latest = previous = self._last_updated_timestamp
        while not self._host_messages.empty():
            latest = max(latest, self._host_messages.get())
        # Rank 0 decides, so all ranks agree.
        self._last_updated_timestamp, plan = self._bcast_object((latest, _propose()))
        if plan:
            self.pending_plan = plan
            raise HostsUpdatedInterrupt(skip_sync=not plan.spawn)
        if self._last_updated_timestamp > previous:
            raise HostsUpdatedInterrupt()

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class ObjectState(State):
    """State of plain Python objects, given as keyword arguments and exposed as attributes."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int], **kwargs: Any) -> None:
        self._saved_state = copy.deepcopy(kwargs)
        self._set_attrs()
        super().__init__(bcast_object, get_rank)

    def save(self) -> None:
        self._saved_state = {name: copy.deepcopy(getattr(self, name)) for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Horovod's ``hvd.elastic.run``: call ``func(state, ...)`` with every rank's state synced first.

    On ``HostsUpdatedInterrupt`` the state is re-synced and ``func`` called again. On
    ``HorovodInternalError`` (a peer died) the last commit is restored; in elastic mode
    (``hvdliterun --min-np N``) the survivors then re-form the job without the dead ranks, call the
    reset callbacks, sync the state from the new rank 0 and call ``func`` again. Outside elastic
    mode the error is raised after the restore. A failure while syncing is handled the same way.
    """
    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        reset = False
        while True:
            if reset:
                state.on_reset()
            try:
                state.sync()  # a peer may die here too: the survivors re-form and sync again
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                state.restore()
                if not _elastic():
                    raise
                _reform()
            except HostsUpdatedInterrupt:
                plan, state.pending_plan = state.pending_plan, None
                if plan:
                    _apply(plan)
            reset = True
    return wrapper


def _elastic() -> bool:
    from .basics import is_initialized
    from .runtime import current

    return is_initialized() and bool(current().config.elastic_min_np)


def _propose() -> Any:
    if not _elastic():
        return None
    from .reform import propose

    return propose()


def _apply(plan: Any) -> None:
    from .reform import apply

    apply(plan)


def _reform() -> None:
    from .reform import shrink

    shrink()
