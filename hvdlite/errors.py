"""Exception hierarchy. Every error hvdlite raises derives from :class:`HvdliteError`."""

from __future__ import annotations


class HvdliteError(RuntimeError):
    """Base class of every hvdlite error."""

    # TensorFlow's autograph re-raises an error from a traced function with its own type only if the
    # type's __init__ is Exception's; otherwise the caller gets a StagingError instead of ours.
    __init__ = Exception.__init__


class NotInitializedError(HvdliteError, ValueError):
    """An hvdlite function was called before ``init()`` (or after ``shutdown()``). Also a
    ``ValueError``, the type Horovod raises for it ("Horovod has not been initialized")."""


class ConfigError(HvdliteError, ValueError):
    """An ``HVDLITE_*`` variable or launcher flag has a bad value."""


class TensorMismatchError(HvdliteError, ValueError):
    """Ranks submitted the same tensor name with different shape, dtype, op, or arguments."""


class InvalidArgumentError(HvdliteError, ValueError):
    """An argument is out of range on this rank (a root or peer that is not a rank of the group, an
    output of the wrong size); raised before anything is sent."""


class DuplicateNameError(HvdliteError, ValueError):
    """A tensor name was submitted while a request with the same name is still in flight."""


class UnsupportedOperationError(HvdliteError, ValueError, NotImplementedError):
    """The operation, dtype, or argument combination is not supported.

    Also a ``NotImplementedError`` and a ``ValueError``, the types Horovod raises for these cases.
    """


class ProcessSetError(HvdliteError, ValueError):
    """A process set is unknown, removed, badly formed, not the same on every rank, or does not
    include the rank that used it."""


class StallError(HvdliteError):
    """Ranks waited on tensors that other ranks never submitted, past the shutdown deadline."""


class HvdliteShutdownError(HvdliteError):
    """The background engine stopped (shutdown, a fatal error, or a peer shut down)."""


class CommTimeoutError(HvdliteShutdownError):
    """A collective or negotiation made no progress within ``HVDLITE_COMM_TIMEOUT_SECONDS``.

    The message names the ranks that did not answer afterwards (unreachable, or stopped);
    ``unreachable`` lists them (ranks of the communicator that timed out).
    """

    def __init__(self, message: str, unreachable: list[int] | None = None) -> None:
        super().__init__(message)
        self.unreachable = unreachable or []


class DeviceError(HvdliteShutdownError):
    """The GPU data plane failed on this rank (NCCL or CUDA). The job ends: peers cannot continue."""


# Horovod's name for a failed collective; elastic-style code catches it.
HorovodInternalError = HvdliteShutdownError


class PeerFailedError(HvdliteShutdownError):
    """A process of the job died (elastic mode: the survivors can re-form the job without it)."""

    def __init__(self, dead: list[str] | list[int] | str) -> None:
        if isinstance(dead, str):  # re-raised from a handle with its message
            super().__init__(dead)
            self.dead: list[str] = []
            return
        # Process ids: the launch's COMM_WORLD rank ("2"), or "g<N>.<rank>" for a rank the job spawned.
        self.dead = [str(process_id) for process_id in dead]
        super().__init__(f"rank(s) [{', '.join(self.dead)}] of the job died (process ids: the launch's ranks, "
                         "g<N>.<r> for spawned ones); hvd.elastic.run re-forms the job without them")


class HostsUpdatedInterrupt(RuntimeError):  # noqa: N818 - Horovod's name
    """Hosts were added or removed: raised by ``state.commit()`` / ``check_host_updates()`` on every
    rank at once, so that ``hvd.elastic.run`` can re-form the world at a commit boundary (Horovod's).

    ``skip_sync``: the state needs no broadcast afterwards (only ranks were removed).
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts were updated")
        self.skip_sync = skip_sync


def comm_timeout(rank: int, size: int, doing: str, seconds: float, answered: set[int], window: float,
                 timeout_seconds: float, peer: int | None = None) -> CommTimeoutError:
    """The error of a wait on ``rank`` that made no progress while ``doing`` something, naming the
    ranks that did not answer a probe within ``window`` seconds afterwards (``answered`` did).
    ``peer``: the rank whose wait timed out first and ended this one (None: this rank's own deadline)."""
    missing = sorted(set(range(size)) - answered)
    setting = f"HVDLITE_COMM_TIMEOUT_SECONDS={timeout_seconds:g}"
    if missing:
        who = (f"rank(s) {missing} did not answer a probe within {window:g} s (unreachable, or stopped "
               f"answering); rank(s) {sorted(answered)} did")
    else:
        who = f"every rank answered afterwards, so one made no progress; raise {setting} if a step needs longer"
    stalled = f"made no progress for {seconds:g} s" if peer is None else \
        f"was ended by rank {peer}, whose wait made no progress for {seconds:g} s"
    return CommTimeoutError(f"rank {rank}: {doing} {stalled} ({setting}); {who}; the job cannot continue", missing)
