"""torch's own FSDP2 on the hvdlite backend: a Transformer, sharded per block, checkpointed and resumed.

Run:  hvdliterun -np 2 python examples/torch_fsdp2.py [--dcp-api] [--explicit-prefetching]
                                                     [--mixed-precision] [--steps 10] [--check]
                                                     [--hvdlite-fully-shard]

The FSDP2 recipe of pytorch/examples (distributed/FSDP2) on hvdlite, unchanged but for two lines:
``hvd.init()`` and ``dist.init_process_group("hvdlite")``. The model is built on the meta device,
``fully_shard`` wraps each block and then the root (optionally with a ``MixedPrecisionPolicy`` and
explicit prefetching), its parameters are DTensors sharded on dimension 0, gradients are clipped by
``torch.nn.utils.clip_grad_norm_`` over the whole model, and a checkpointer saves full state dicts
through one of two paths: DTensor (``model.state_dict()`` and ``full_tensor()``; loading with
``distribute_tensor``) or DCP's ``get_model_state_dict`` / ``set_model_state_dict`` with
``full_state_dict`` and ``broadcast_from_rank0``. Started again with the same ``--checkpoint-dir``,
it resumes from the latest checkpoint, at any number of ranks.

``--hvdlite-fully-shard`` imports ``fully_shard``, ``FSDPModule`` and ``MixedPrecisionPolicy`` from
``hvdlite.torch`` instead of ``torch.distributed.fsdp``, and changes nothing else: hvdlite's
``fully_shard`` gives the same DTensor parameters, so the same clipping, checkpointer, prefetching and
inspection run on it.

``--check`` (fp32 only) replays the run in one process on each step's whole batch, every rank's
slice of it concatenated (resumed runs included, at the numbers of ranks they had), and asserts that
the sharded model's weights equal the replay's to 1e-5.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

import hvdlite.torch as hvd

if "--hvdlite-fully-shard" in sys.argv:  # hvdlite's fully_shard, under FSDP2's names: nothing else changes
    from hvdlite.torch import FullyShardedModule as FSDPModule
    from hvdlite.torch import MixedPrecisionPolicy, fully_shard
else:
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH = 128, 32, 4, 4, 16, 4  # BATCH: sequences per rank
# eps well above float32's rounding of the gradients: Adam divides by sqrt(v) + eps, and for an entry
# whose gradient is ~0 the last bits (sharded and whole-batch sums round differently) would decide
# the step's sign with a tiny eps, and --check could not compare to 1e-5.
ADAM = {"lr": 1e-2, "eps": 1e-3}


class Block(nn.Module):
    """Pre-norm attention and MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).view(x.shape[0], SEQ, 3, HEADS, DIM // HEADS).unbind(2)
        attended = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(x.shape))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.position = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position(torch.arange(SEQ))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def initial_weights() -> dict[str, torch.Tensor]:
    """The starting weights, the same in every run: a plain model's, seeded."""
    torch.manual_seed(0)
    return Transformer().state_dict()


def batch(step: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s tokens at ``step`` (the same whatever the number of ranks)."""
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1000 * step + rank))


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor) -> None:
    logits = model(tokens)
    F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)  # the whole model's norm (DTensors)
    optimizer.step()
    optimizer.zero_grad()


class Checkpointer:
    """Full (unsharded) checkpoints in ``folder/<api>/<step>/``, written by rank 0."""

    def __init__(self, folder: str, dcp_api: bool) -> None:
        self.folder = os.path.join(folder, "dcp_api" if dcp_api else "dtensor_api")
        self.dcp_api = dcp_api
        steps = [int(n) for n in os.listdir(self.folder) if n.isdigit()] if os.path.isdir(self.folder) else []
        self.last = max(steps, default=None)
        self.history = self._read("history.json") if self.last is not None else []  # ranks of each step

    def _read(self, name: str) -> dict | list:
        path = os.path.join(self.folder, str(self.last), name)
        if name.endswith(".json"):
            with open(path) as handle:
                return json.load(handle)
        return torch.load(path, mmap=True, weights_only=True, map_location="cpu")

    def load_model(self, model: FSDPModule, full: dict[str, torch.Tensor] | None = None) -> None:
        full = self._read("model.pt") if full is None else full
        if self.dcp_api:
            set_model_state_dict(model, full if dist.get_rank() == 0 else {},
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
            return
        sharded = {name: nn.Parameter(distribute_tensor(full[name], meta.device_mesh, meta.placements))
                   for name, meta in model.state_dict().items()}
        model.load_state_dict(sharded, assign=True)  # assign: the parameters are still on the meta device

    def load_optimizer(self, model: FSDPModule, optimizer: torch.optim.Optimizer) -> None:
        # DCP path: rank 0 reads the file and broadcasts; DTensor path: every rank reads it
        full = self._read("optim.pt") if dist.get_rank() == 0 or not self.dcp_api else {}
        set_optimizer_state_dict(model, optimizer, full,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=self.dcp_api))

    def save(self, model: FSDPModule, optimizer: torch.optim.Optimizer, step: int, history: list[int]) -> None:
        if self.dcp_api:
            model_state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                               cpu_offload=True))
        else:
            model_state = {name: p.full_tensor().cpu() for name, p in model.state_dict().items()}
        optim_state = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True,
                                                                                          cpu_offload=True))
        if dist.get_rank() == 0:
            folder = os.path.join(self.folder, str(step))
            os.makedirs(folder, exist_ok=True)
            torch.save(model_state, os.path.join(folder, "model.pt"))
            torch.save(optim_state, os.path.join(folder, "optim.pt"))
            with open(os.path.join(folder, "history.json"), "w") as handle:
                json.dump(history, handle)
        dist.barrier()


def inspect_model(model: nn.Module, mixed_precision: bool) -> None:
    assert isinstance(model, FSDPModule) and isinstance(model, Transformer)
    for param in model.parameters():
        assert isinstance(param, DTensor) and param.placements == (Shard(0),), param
        assert param.dtype == torch.float32
    if mixed_precision:
        model.unshard()
        for param in model.parameters(recurse=False):  # the root's own: full and in bf16 now
            assert param.dtype == torch.bfloat16 and not isinstance(param, DTensor), param
        model.reshard()


def replay(history: list[int]) -> dict[str, torch.Tensor]:
    """One process, each step on the whole batch of the ranks that ran it."""
    model = Transformer()
    model.load_state_dict(initial_weights())
    optimizer = torch.optim.Adam(model.parameters(), **ADAM)
    for step, ranks in enumerate(history):
        train_step(model, optimizer, torch.cat([batch(step, r) for r in range(ranks)]))
    return model.state_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--explicit-prefetching", action="store_true")
    parser.add_argument("--mixed-precision", action="store_true")
    parser.add_argument("--dcp-api", action="store_true")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--check", action="store_true", help="compare with one process (fp32 only)")
    parser.add_argument("--hvdlite-fully-shard", action="store_true", help="hvdlite's fully_shard for torch's")
    args = parser.parse_args()

    hvd.init()
    dist.init_process_group("hvdlite")  # the one line that differs from a torchrun + NCCL/gloo script
    torch.set_num_threads(1)
    with torch.device("meta"):
        model = Transformer()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kwargs = {"mp_policy": policy} if args.mixed_precision else {}
    for layer in model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    if args.explicit_prefetching:
        for i, layer in enumerate(model.layers):
            layer.set_modules_to_forward_prefetch(list(model.layers[i + 1:i + 3]))
            layer.set_modules_to_backward_prefetch(list(model.layers[max(0, i - 2):i])[::-1])

    checkpointer = Checkpointer(args.checkpoint_dir, args.dcp_api)
    model.to_empty(device="cpu")
    checkpointer.load_model(model, initial_weights() if checkpointer.last is None else None)
    inspect_model(model, args.mixed_precision)
    optimizer = torch.optim.Adam(model.parameters(), **ADAM)
    if checkpointer.last is not None:
        checkpointer.load_optimizer(model, optimizer)
    history = list(checkpointer.history)
    for step in range(len(history), len(history) + args.steps):
        if args.explicit_prefetching:
            model.unshard()
        train_step(model, optimizer, batch(step, dist.get_rank()))
        history.append(dist.get_world_size())
    checkpointer.save(model, optimizer, len(history), history)

    if args.check:
        assert not args.mixed_precision, "--check compares fp32 runs"
        full = {name: p.full_tensor() for name, p in model.state_dict().items()}
        if dist.get_rank() == 0:
            expected = replay(history)
            worst = max((full[name] - expected[name]).abs().max().item() for name in expected)
            assert worst < 1e-5, f"sharded model and one process differ by {worst}"
            print(f"equal to one process after {len(history)} steps (ranks per step {history}): max diff {worst:.2e}")
    if dist.get_rank() == 0:
        print(f"trained to step {len(history)}; checkpoint in {checkpointer.folder}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
