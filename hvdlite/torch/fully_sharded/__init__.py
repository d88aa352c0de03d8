"""Sharded parameters (ZeRO-3 / FSDP) for PyTorch: :func:`fully_shard`, as FSDP2 spells it."""

from .checkpoint import load_sharded_state, save_sharded_state
from .shard import FullyShardedModule, MixedPrecisionPolicy, fully_shard
from .state import (
    clip_grad_norm_,
    full_optimizer_state_dict,
    full_state_dict,
    load_full_optimizer_state_dict,
    load_full_state_dict,
)

__all__ = ["FullyShardedModule", "MixedPrecisionPolicy", "fully_shard", "clip_grad_norm_", "full_state_dict", "load_full_state_dict",
           "full_optimizer_state_dict", "load_full_optimizer_state_dict", "save_sharded_state", "load_sharded_state"]
