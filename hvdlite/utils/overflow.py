"""Overflow to inf is a reduction's result, as in MPI, not a warning: NumPy's error state, switched cheaply.

``with np.errstate(over="ignore", invalid="ignore")`` runs about 60 Python bytecodes (its
``__init__``, ``__enter__`` and ``__exit__``), as much as the rest of a reduction on the small-op
path (:mod:`hvdlite.core.pipeline.lone`). NumPy 2 keeps the error state in a context variable,
set by C functions that errstate calls; here they are called directly, with no Python frame::

    token = overflow.enter(overflow.ignoring())
    try: ... finally: overflow.restore(token)

With another NumPy the same three names fall back to an ``errstate``.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

try:  # NumPy 2's own machinery behind np.errstate (numpy/_core/_ufunc_config.py)
    from numpy._core.umath import _extobj_contextvar, _make_extobj
except ImportError:  # pragma: no cover - another NumPy: the public, slower way
    ignoring: Any = functools.partial(np.errstate, over="ignore", invalid="ignore")

    def enter(state: Any) -> Any:
        state.__enter__()
        return state

    def restore(token: Any) -> None:
        token.__exit__(None, None, None)
else:
    ignoring = functools.partial(_make_extobj, over="ignore", invalid="ignore")  # this thread's state, so changed
    enter = _extobj_contextvar.set  # returns the token that restores the state before
    restore = _extobj_contextvar.reset
