"""Run a function on a module once it is imported: now if it already is, else right after its import
(hvdlite adapts other libraries, such as Accelerate and Lightning, whichever is imported first)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of the modules it waits for, to call back after them."""

    def __init__(self) -> None:
        self.waiting: dict[str, list[Callback]] = {}

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        callbacks = self.waiting.get(name)
        if not callbacks:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None  # another finder's module: not waited for here
        del self.waiting[name]
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            for callback in callbacks:
                callback(module)
        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_FINDER = _AfterImport()


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` for the module ``name``: at once if it is imported, else after its import."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    _FINDER.waiting.setdefault(name, []).append(callback)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
