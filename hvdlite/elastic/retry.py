"""Horovod's ``hvd.elastic.run``: the retry loop around a training function.

On ``HorovodInternalError`` (a peer died) the last commit is restored and, in elastic mode, the
survivors re-form the job (:mod:`hvdlite.elastic.reform`); on ``HostsUpdatedInterrupt`` the world
change agreed at a commit is carried out. Either way every rank's state is synced and the function
called again.

Inside a ``tf.function`` or ``jax.jit`` a collective runs in a host callback, and the framework
re-raises its error as its own type (``tf.errors.UnknownError``, ``jax.errors.JaxRuntimeError``)
with the original error's name in the message. :func:`translating_run` turns those back into
``HorovodInternalError`` first.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..errors import HorovodInternalError, HostsUpdatedInterrupt, HvdliteShutdownError
from .reform import apply, elastic_mode, shrink
from .state import State


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
                state.reformed = reset  # a state may leave out what every survivor restored alike
                state.sync()  # a peer may die here too: the survivors re-form and sync again
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                state.restore()
                if not elastic_mode():
                    raise
                shrink()
            except HostsUpdatedInterrupt:
                plan, state.pending_plan = state.pending_plan, None
                if plan:
                    apply(plan)
            reset = True
    return wrapper


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
    def run_(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def translated(state: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return func(state, *args, **kwargs)
            except framework_errors as exc:
                if not caused_by_shutdown(exc):
                    raise
                raise HorovodInternalError(f"a collective failed inside a compiled function: {exc}") from exc
        return run(translated)
    run_.__doc__ = run.__doc__
    return run_
