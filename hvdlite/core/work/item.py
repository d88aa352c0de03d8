"""The work item: what the executor runs on one data plane, one or several fused responses.

It lives below both the pipeline (whose fusion stage builds items) and the planes (which run
them), so neither imports the other for it.
"""

from __future__ import annotations

from typing import NamedTuple

from .response import Response


class WorkItem(NamedTuple):
    """One unit of execution: several packed allreduces, or a single response.

    Compared by identity where it matters (the engine's list of started items).
    """

    responses: tuple[Response, ...]
    fused: bool = False


def describe(item: WorkItem) -> str:
    """What ``item`` does, for error messages: the collective and up to three tensor names."""
    names = [r.meta.name for r in item.responses]
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"{item.responses[0].meta.collective.name.lower()} of {names[:3]}{more}"
