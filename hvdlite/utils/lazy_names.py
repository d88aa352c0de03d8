"""A package's public names, loaded on first use (PEP 562's module ``__getattr__``).

``hvdliterun`` and the task services of Spark and Ray import ``hvdlite.runner``, which needs only
small, pure-Python parts of ``hvdlite``; importing a package runs its ``__init__`` first, so a package
that re-exported its names eagerly made every launcher import NumPy and the whole core (about half
of a launcher's start, paid once per job).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: dict[str, Any], homes: Mapping[str, str], rest: tuple[str, ...] = (),
               submodules: tuple[str, ...] = ()) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the package whose globals are ``package``: each name of
    ``homes`` comes from the module it maps to (relative to the package), and every name in the
    ``__all__`` of a module of ``rest`` from that module. ``__all__`` itself is their union. Each of
    ``submodules`` is that submodule, imported: ``import hvdlite as hvd; hvd.elastic.run`` worked
    when the package imported its submodules eagerly, and still does."""
    name = package["__name__"]

    def module(relative: str) -> Any:
        return importlib.import_module(relative, name)

    def public() -> list[str]:
        return [*(exported for relative in rest for exported in module(relative).__all__), *homes]

    def home(attribute: str) -> str | None:
        if attribute in homes:
            return homes[attribute]
        if attribute.startswith("__"):  # a tool's probe (__wrapped__, ...): not worth loading ``rest`` for
            return None
        return next((relative for relative in rest if attribute in module(relative).__all__), None)

    def getattr_(attribute: str) -> Any:
        if attribute == "__all__":
            value: Any = public()
        else:
            found = home(attribute)
            if found is not None:
                value = getattr(module(found), attribute)
            elif attribute in submodules:
                value = module(f".{attribute}")
            else:
                raise AttributeError(f"module {name!r} has no attribute {attribute!r}")
        package[attribute] = value  # looked up once
        return value

    def dir_() -> list[str]:
        return sorted({*package, *public()})

    return getattr_, dir_
