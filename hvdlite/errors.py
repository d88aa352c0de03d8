"""Exception hierarchy. Every error hvdlite raises derives from :class:`HvdliteError`."""

from __future__ import annotations


class HvdliteError(RuntimeError):
    """Base class of every hvdlite error."""


class NotInitializedError(HvdliteError):
    """An hvdlite function was called before ``init()`` (or after ``shutdown()``)."""


class ConfigError(HvdliteError, ValueError):
    """An ``HVDLITE_*`` variable or launcher flag has a bad value."""


class TensorMismatchError(HvdliteError, ValueError):
    """Ranks submitted the same tensor name with different shape, dtype, op, or arguments."""


class DuplicateNameError(HvdliteError, ValueError):
    """A tensor name was submitted while a request with the same name is still in flight."""


class UnsupportedOperationError(HvdliteError, ValueError):
    """The operation, dtype, or argument combination is not supported."""


class StallError(HvdliteError):
    """Ranks waited on tensors that other ranks never submitted, past the shutdown deadline."""


class HvdliteShutdownError(HvdliteError):
    """The background engine stopped (shutdown, a fatal error, or a peer shut down)."""


# Horovod's name for a failed collective; elastic-style code catches it.
HorovodInternalError = HvdliteShutdownError
