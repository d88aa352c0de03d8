"""Lightning scripts with no hvdlite line in them. Usage: lightning_train.py KIND[,KIND...] OUT [single]

KIND: ``trainer`` (``Trainer`` with DDP), ``fabric`` (``Fabric`` with DDP), ``fsdp2``
(``ModelParallelStrategy``: ``fully_shard`` in ``configure_model``, a distributed checkpoint after
two steps, and a second ``Trainer`` that resumes from it with ``fit(ckpt_path=...)``), or ``named``
(``import hvdlite.torch`` and ``Trainer(strategy="hvdlite")``, devices left to hvdlite; under plain
``hvdliterun``). Run under torchrun (on gloo) or ``hvdliterun --torch-backend hvdlite`` (on
hvdlite); ``single``: one process on the whole batch. Several kinds run one after another in the
same processes and process group (Lightning and Fabric use the one they find: a process's start
with Lightning is seconds of CPU). Rank 0 saves each kind's parameters to ``OUT.KIND.pt`` and every
rank prints its backend.
"""

import os
import sys

import lightning as L
import torch
import torch.distributed as dist

GLOBAL_BATCH, STEPS = 12, 4


def dataset():
    generator = torch.Generator().manual_seed(7)
    data = torch.randn(GLOBAL_BATCH * STEPS, 6, generator=generator)
    return torch.utils.data.TensorDataset(data, torch.randn(GLOBAL_BATCH * STEPS, 3, generator=generator))


def loader(rank, world):
    """This rank's contiguous share of each global batch (torch's DistributedSampler interleaves
    and Lightning's shuffles), so that one process on the whole batch is the reference."""
    share = GLOBAL_BATCH // world
    mine = [step * GLOBAL_BATCH + rank * share + i for step in range(STEPS) for i in range(share)]
    return torch.utils.data.DataLoader(dataset(), batch_size=share, sampler=mine)


def network():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


class Regression(L.LightningModule):
    def __init__(self, sharded=False):
        super().__init__()
        self.net, self.sharded = network(), sharded

    def configure_model(self):
        if self.sharded:
            from torch.distributed.fsdp import fully_shard
            for layer in self.net:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=self.device_mesh)
            fully_shard(self.net, mesh=self.device_mesh)

    def training_step(self, batch, _):
        data, target = batch
        return torch.nn.functional.mse_loss(self.net(data), target)

    def train_dataloader(self):
        return loader(self.global_rank, self.trainer.world_size)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def full_parameters(model):
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in model.state_dict().items()}


def fit(world, steps, out, sharded, ckpt_path=None, named=False):
    strategy = "auto" if world == 1 else L.pytorch.strategies.ModelParallelStrategy() if sharded else "ddp"
    placement = {"strategy": "hvdlite"} if named else {"devices": world, "strategy": strategy}  # named: as Horovod's users wrote it
    trainer = L.Trainer(accelerator="cpu", **placement, max_steps=steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        use_distributed_sampler=False)
    model = Regression(sharded and world > 1)  # one process: the same steps, checkpoint and resume, unsharded
    trainer.fit(model, ckpt_path=ckpt_path)
    if sharded and ckpt_path is None:
        trainer.save_checkpoint(out + ".ckpt")
    return trainer, full_parameters(model)


def fabric_fit(world):
    fabric = L.Fabric(accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto")
    fabric.launch()
    model = network()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    for data, target in fabric.setup_dataloaders(loader(fabric.global_rank, world), use_distributed_sampler=False):
        optimizer.zero_grad()
        fabric.backward(torch.nn.functional.mse_loss(model(data), target))
        optimizer.step()
    return fabric.global_rank, full_parameters(model.module)


def train(kind, out, single):
    """One kind's run; returns this process's rank and the parameters it ends with."""
    if kind == "named":  # Trainer(strategy="hvdlite") under plain hvdliterun: the one hvdlite line
        import hvdlite.torch  # noqa: F401
        trainer, parameters = fit(None, STEPS, out, sharded=False, named=True)
        return trainer.global_rank, parameters
    if kind == "fabric":
        return fabric_fit(1 if single else int(os.environ["WORLD_SIZE"]))
    world = 1 if single else int(os.environ["WORLD_SIZE"])
    sharded = kind == "fsdp2"
    trainer, parameters = fit(world, STEPS // 2 if sharded else STEPS, out, sharded)
    if sharded:  # a second Trainer resumes from the distributed checkpoint and trains the rest
        trainer, parameters = fit(world, STEPS, out, sharded, ckpt_path=out + ".ckpt")
    return trainer.global_rank, parameters


def main(kinds, out, single=None):
    torch.set_num_threads(1)
    for kind in kinds.split(","):
        rank, parameters = train(kind, f"{out}.{kind}", single)
        if rank == 0:
            torch.save(parameters, f"{out}.{kind}.pt")
        backend = dist.get_backend() if dist.is_initialized() else None
        print(f"lightning {kind} ok backend {backend} rank {rank}", flush=True)
    if dist.is_initialized():
        # Lightning leaves the process group to the interpreter's exit, where gloo's threads were once
        # destroyed still joinable ("terminate called without an active exception", SIGABRT; CI 12-03).
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
