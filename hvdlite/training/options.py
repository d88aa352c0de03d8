"""The options every adapter's optimizer and collectives take, checked and turned into numbers once.

One check and one message per option, so that torch, TensorFlow/Keras and JAX refuse the same
arguments with the same words.
"""

from __future__ import annotations

import operator

from ..errors import UnsupportedOperationError
from ..ops import ReduceOp


def check_passes(passes: object) -> int:
    """``backward_passes_per_step`` as an int, or a ValueError if it is not a positive whole number."""
    return check_count(passes, "backward_passes_per_step", minimum=1)


def check_count(value: object, name: str, minimum: int) -> int:
    """``value`` as an int of at least ``minimum``, or a ValueError naming ``name`` and the value."""
    try:
        # operator.index takes int and NumPy integers but not floats: 1.5 steps cannot be counted.
        count = operator.index(value) if not isinstance(value, bool) else minimum - 1
    except TypeError:
        count = minimum - 1
    if count < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    return count


def predivide_scales(op: ReduceOp, gradient_predivide_factor: float) -> tuple[float, float]:
    """(prescale, postscale) for ``gradient_predivide_factor``: divide by f before the sum, by size/f after.

    Dividing part of the way before summing keeps float16 sums from overflowing, as in Horovod. The
    division by the number of ranks is the Average op's own, so the postscale is f, not f/size.
    """
    if gradient_predivide_factor == 1.0:
        return 1.0, 1.0
    if op is not ReduceOp.AVERAGE:
        raise ValueError(f"gradient_predivide_factor={gradient_predivide_factor} needs op=Average, got {op.name}")
    return 1.0 / gradient_predivide_factor, gradient_predivide_factor


def reduction_scale(op: ReduceOp, prescale: float, postscale: float, size: int) -> float:
    """The factor a plain sum over ``size`` ranks is multiplied by to give ``op`` with these scale factors.

    For the places that sum without the core's reduction (sparse rows gathered, the gradient of a
    reducescatter) and must scale as the reduction would have.
    """
    return prescale * postscale / (size if op is ReduceOp.AVERAGE else 1)


def require_sum_or_average(op: ReduceOp, what: str, hint: str = "") -> None:
    """Refuse any op but Sum and Average for ``what`` (a phrase naming the call and tensor)."""
    if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise UnsupportedOperationError(f"{what} supports Sum and Average, not {op.name}{hint}")


def refuse_with_adasum(options: dict[str, bool]) -> None:
    """The options ``DistributedOptimizer(op=Adasum)`` does not combine with (name -> given), refused by name."""
    given = [name for name, used in options.items() if used]
    if given:
        raise ValueError(f"DistributedOptimizer(op=Adasum) cannot be combined with {', '.join(given)} (not built)")

