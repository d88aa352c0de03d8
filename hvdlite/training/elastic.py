"""What the TensorFlow/Keras and JAX elastic states share: framework values saved beside plain
attributes, and ``run`` for code whose collectives run inside compiled functions.

A state's framework values (a model's variables, a pytree of parameters) are copied to host memory
by ``save``, put back by ``restore`` and broadcast from rank 0 by ``sync``, which then saves them,
as Horovod's TensorFlow states do: a restore right after a sync gives the synced values, the same on
every rank. Plain attributes go through :class:`hvdlite.elastic.ObjectState`.

Inside a ``tf.function`` or ``jax.jit`` a collective runs in a host callback, and the framework
re-raises its error as its own type (``tf.errors.UnknownError``, ``jax.errors.JaxRuntimeError``)
with the original error's name in the message. :func:`translating_run` turns those back into
``HorovodInternalError`` so that :func:`hvdlite.elastic.run` restores the last commit and, in
elastic mode, re-forms the job.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .. import basics, objects
from ..elastic import ObjectState
from ..elastic import run as _run
from ..errors import HorovodInternalError, HvdliteShutdownError


class FrameworkState(ObjectState):
    """An :class:`ObjectState` whose subclass also saves, restores and syncs framework values.

    Subclasses set their framework attributes, call ``super().__init__(**plain_attributes)`` and
    implement ``_save_values``, ``_restore_values`` and ``_sync_values`` (a collective from rank 0).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(lambda obj: objects.broadcast_object(obj, 0), basics.rank, **kwargs)
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


def _shutdown_error_names() -> set[str]:
    found, pending = set(), [HvdliteShutdownError]
    while pending:
        cls = pending.pop()
        found.add(cls.__name__)
        pending.extend(cls.__subclasses__())
    return found


def caused_by_shutdown(error: BaseException) -> bool:
    """Whether a framework's error wraps hvdlite's (a peer died, the engine stopped or timed out)."""
    text = str(error)
    return any(f"{name}:" in text for name in _shutdown_error_names())


def translating_run(framework_errors: tuple[type[BaseException], ...]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Horovod's ``hvd.elastic.run`` for a framework whose compiled functions re-raise collective
    errors as ``framework_errors``: those caused by hvdlite's shutdown errors become
    ``HorovodInternalError``; others propagate unchanged."""
    def run(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def translated(state: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return func(state, *args, **kwargs)
            except framework_errors as exc:
                if not caused_by_shutdown(exc):
                    raise
                raise HorovodInternalError(f"a collective failed inside a compiled function: {exc}") from exc
        return _run(translated)
    run.__doc__ = _run.__doc__
    return run
