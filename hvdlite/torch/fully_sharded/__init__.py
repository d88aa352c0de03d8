"""Sharded parameters (ZeRO-3 / FSDP) for PyTorch: :func:`fully_shard`, as FSDP2 spells it."""

from .shard import FullyShardedModule, fully_shard
from .state import clip_grad_norm_, full_state_dict, load_full_state_dict

__all__ = ["FullyShardedModule", "fully_shard", "clip_grad_norm_", "full_state_dict", "load_full_state_dict"]
