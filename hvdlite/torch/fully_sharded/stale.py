"""Refuse an optimizer that steps parameters ``fully_shard`` has replaced.

An optimizer built before ``fully_shard`` (or before ``to_empty`` moved a model built on ``meta``)
holds Parameters the modules no longer use: they never get a gradient, so ``step()`` skips them
and the model silently stops learning. Every torch optimizer's step first passes through one
global pre-hook, registered by the first ``fully_shard`` call, that looks once at each optimizer's
parameters (again only if their number changes) and raises, naming the parameter.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

_checked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> parameters seen
_handle: Any = None


def mark_replaced(param: torch.nn.Parameter, by: str) -> None:
    """``param`` was on the model and is no more: ``by`` says what took its place."""
    param._hvdlite_replaced_by = by


def watch_optimizers() -> None:
    """Register the pre-hook once per process."""
    global _handle
    if _handle is None:
        _handle = register_optimizer_step_pre_hook(_check)


def _check(optimizer: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
    count = sum(len(group["params"]) for group in optimizer.param_groups)
    if _checked.get(optimizer) == count:
        return
    for index, param in enumerate(p for group in optimizer.param_groups for p in group["params"]):
        by = getattr(param, "_hvdlite_replaced_by", None)
        if by is not None:
            raise ValueError(f"{type(optimizer).__name__}: its parameter {index} (shape {tuple(param.shape)}) is no "
                             f"longer on the model: {by}. Build the optimizer after fully_shard (and after to_empty), "
                             "from model.parameters()")
    _checked[optimizer] = count


__all__ = ["mark_replaced", "watch_optimizers"]
