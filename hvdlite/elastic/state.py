"""Horovod's elastic state objects, for every framework: what a training loop commits and restores.

``state.commit()`` copies the tracked objects to host memory (and checks whether hosts were
updated); ``state.restore()`` brings back the last commit; ``state.sync()`` gives every rank rank
0's copy. :class:`ObjectState` tracks plain Python attributes; :class:`FrameworkState` adds the
framework values that the adapters' states (``hvdlite.torch.elastic.TorchState``, ...) save beside
them: copied to host memory by ``save``, put back by ``restore`` and broadcast from rank 0 by
``sync``, which then saves them, as Horovod's TensorFlow states do (a restore right after a sync
gives the synced values, the same on every rank).
"""

from __future__ import annotations

import copy
import queue
from collections.abc import Callable, Iterable
from typing import Any

from .. import objects
from ..core import runtime
from ..errors import HostsUpdatedInterrupt
from .reform import elastic_mode, propose, start_spares


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
        # Commits since the last sync: ranks with the same count (at least one) restore the same commit.
        self.commits_since_sync = 0
        self.reformed = False  # set by hvd.elastic.run for the sync right after the world changed

    def restored_alike(self) -> bool:
        """Whether every rank holds the same commit, with nothing to broadcast for replicas that average
        every step: true in ``hvd.elastic.run``'s re-sync after a world change when every rank made the
        same number (at least one) of commits since the last sync (a rank that joined has made none; a
        death in the middle of a commit leaves the survivors' counts apart). Collective: every rank's
        sync calls it alike. Resets the count and ``reformed`` for the next sync."""
        counts = objects.allgather_object((self.reformed, self.commits_since_sync), name="elastic.commits")
        self.reformed, self.commits_since_sync = False, 0
        return all(reformed for reformed, _ in counts) and len({count for _, count in counts}) == 1 and counts[0][1] >= 1

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
        self.commits_since_sync += 1
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
        self._last_updated_timestamp, plan = self._bcast_object((latest, propose() if elastic_mode() else None))
        if plan is not None:
            start_spares(plan)
        if plan:
            self.pending_plan = plan
            raise HostsUpdatedInterrupt(skip_sync=not plan.new_ranks)
        # New ranks that start as spares first change the world at their admission, not now.
        if self._last_updated_timestamp > previous and not (plan is not None and plan.deferred):
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


class FrameworkState(ObjectState):
    """An :class:`ObjectState` whose subclass also saves, restores and syncs framework values.

    Subclasses set their framework attributes, call ``super().__init__(**plain_attributes)`` and
    implement ``_save_values``, ``_restore_values`` and ``_sync_values`` (a collective from rank 0).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(lambda obj: objects.broadcast_object(obj, 0), lambda: runtime.current().topology.rank,
                         **kwargs)
        self._save_values()

    def save(self) -> None:
        self._save_values()
        super().save()

    def restore(self) -> None:
        self._restore_values()
        super().restore()

    def sync(self) -> None:
        self._sync_values()
        self._save_values()
        super().sync()

    def _save_values(self) -> None:
        raise NotImplementedError

    def _restore_values(self) -> None:
        raise NotImplementedError

    def _sync_values(self) -> None:
        raise NotImplementedError
