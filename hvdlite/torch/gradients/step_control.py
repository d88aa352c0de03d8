"""What every torch gradient reducer shares: Horovod's messages and the ``skip_synchronize`` block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

ZERO_GRAD_RACE = (
    "optimizer.zero_grad() was called after loss.backward() but before "
    "optimizer.step() or optimizer.synchronize(). This is prohibited as it can cause a race condition."
)
TOO_MANY_PASSES = (
    "Gradients were computed more than backward_passes_per_step times before call to step(). "
    "Increase backward_passes_per_step to accumulate gradients locally."
)


class SkippableSynchronize:
    """``step()`` synchronizes first unless inside :meth:`skip_synchronize` (Horovod's contract)."""

    _should_synchronize = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Inside this block ``step()`` does not synchronize (call ``synchronize()`` yourself first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True


__all__ = ["TOO_MANY_PASSES", "ZERO_GRAD_RACE", "SkippableSynchronize"]
