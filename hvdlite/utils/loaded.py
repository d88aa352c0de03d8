"""isinstance checks against classes of modules that may not have been imported, without importing them.

An object cannot be an instance of a class whose module was never imported, so a check may skip the
import: ``torch.distributed.tensor`` (DTensor) costs half a second of CPU to import, paid by every
rank of a job that never makes a DTensor otherwise.
"""

from __future__ import annotations

import sys
from typing import Any


def is_instance(value: Any, module: str, name: str) -> bool:
    """``isinstance(value, module.name)``, False without importing ``module`` when it was not imported."""
    found = sys.modules.get(module)
    cls = getattr(found, name, None) if found is not None else None
    return cls is not None and isinstance(value, cls)


__all__ = ["is_instance"]
