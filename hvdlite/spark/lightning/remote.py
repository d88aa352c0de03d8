"""What every rank of a Lightning ``TorchEstimator`` fit runs: a Lightning ``Trainer`` on hvdlite.

Each rank starts hvdlite, makes a ``Trainer`` with ``strategy="hvdlite"`` (Lightning's DDP on
hvdlite's backend) and a cluster environment that reports hvdlite's ranks, and fits the
``LightningModule`` on its share of the Parquet data: batches are dicts of column name -> tensor
(Horovod's form: ``batch["features"]``), feature columns in ``input_shapes`` when given. An epoch is
``steps`` batches (``val_steps`` for validation). After every epoch the ranks write a Lightning
checkpoint, which rank 0 saves into the run folder with the history; a fit with the run's ``run_id``
resumes from it (``Trainer.fit(ckpt_path=...)``) and trains ``epochs`` more (Horovod's).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Iterator
from typing import Any

from lightning.pytorch.callbacks import Callback

from ..common.device import agreed_uses_gpu
from ..common.spec import Batch, DataSpec


@dataclasses.dataclass
class LightningSpec:
    """Everything a rank needs, pickled to it."""

    data: DataSpec
    model: bytes
    input_shapes: list[list[int]] | None
    trainer_args: dict[str, Any]
    use_gpu: bool = True


def train(spec: LightningSpec) -> dict[str, Any] | None:
    """Fit on this rank; rank 0 returns the history and the trained model's state (on the CPU)."""
    import cloudpickle
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    if spec.data.seed is not None:
        torch.manual_seed(spec.data.seed)
    model = cloudpickle.loads(spec.model)
    history = _History(hvd)
    with tempfile.TemporaryDirectory(prefix="hvdlite-lightning-") as scratch:
        resume = _resume(spec, history, hvd, scratch)
        trainer = _trainer(spec, history, hvd, os.path.join(scratch, "last.ckpt"))
        trainer.fit(model, _Shard(spec, spec.data.train_batches(hvd.rank(), hvd.size())),
                    _validation(spec, hvd), ckpt_path=resume)
    if hvd.rank() != 0:
        return None
    return {"history": history.epochs, "model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}}


def _trainer(spec: LightningSpec, history: Any, hvd: Any, checkpoint: str) -> Any:
    import lightning as L  # noqa: N812 - Lightning's own name

    import hvdlite.torch.distributed  # noqa: F401 - strategy="hvdlite" in Lightning's registry

    data = spec.data
    gpu = agreed_uses_gpu(spec.use_gpu, hvd.local_rank(), _gpus(spec.use_gpu))
    options = dict(accelerator="gpu" if gpu else "cpu", strategy="hvdlite", plugins=[_environment(hvd)],
                   max_epochs=len(history.epochs) + data.epochs, limit_train_batches=data.steps,
                   limit_val_batches=data.val_steps if data.val_path else 0, num_sanity_val_steps=0,
                   logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, use_distributed_sampler=False,
                   callbacks=[history, _Checkpoint(spec, history, checkpoint)])
    if gpu:
        options["devices"] = [hvd.local_rank()]
    return L.Trainer(**{**options, **spec.trainer_args})


def _gpus(use_gpu: bool) -> int:
    import torch

    return torch.cuda.device_count() if use_gpu else 0


def _environment(hvd: Any) -> Any:
    """A Lightning cluster environment that reports hvdlite's ranks (the ranks exist already)."""
    from lightning.fabric.plugins.environments import LightningEnvironment

    class Hvdlite(LightningEnvironment):
        @property
        def creates_processes_externally(self) -> bool:
            return True

        def world_size(self) -> int:
            return hvd.size()

        def global_rank(self) -> int:
            return hvd.rank()

        def local_rank(self) -> int:
            return hvd.local_rank()

        def node_rank(self) -> int:
            return hvd.cross_rank()

        def set_world_size(self, size: int) -> None:
            """hvdlite's size stands."""

        def set_global_rank(self, rank: int) -> None:
            """hvdlite's rank stands."""

    return Hvdlite()


class _Shard:
    """``steps`` batches of this rank's endless stream per pass (a Lightning epoch): dicts of column
    -> tensor, feature columns reshaped to ``input_shapes``."""

    def __init__(self, spec: LightningSpec, batches: Iterator[Batch], steps: int | None = None) -> None:
        self._spec, self._batches = spec, batches
        self._steps = spec.data.steps if steps is None else steps

    def __len__(self) -> int:
        return self._steps

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for _ in range(self._steps):
            yield self._tensors(next(self._batches))

    def _tensors(self, batch: Batch) -> dict[str, Any]:
        import torch

        data, shapes = self._spec.data, self._spec.input_shapes or []
        tensors = {name: torch.as_tensor(value) for name, value in batch.items()}
        tensors = {name: value.float() if value.dtype == torch.float64 else value for name, value in tensors.items()}
        for name, shape in zip(data.feature_cols, shapes, strict=False):
            tensors[name] = tensors[name].reshape(shape)
        return tensors


def _validation(spec: LightningSpec, hvd: Any) -> _Shard | None:
    batches = spec.data.val_batches(hvd.rank(), hvd.size())
    return None if batches is None else _Shard(spec, batches, spec.data.val_steps)


def _resume(spec: LightningSpec, history: Any, hvd: Any, scratch: str) -> str | None:
    """The run's saved checkpoint, written into ``scratch`` on every rank (read by rank 0), or None."""
    saved = spec.data.saved_checkpoint() if hvd.rank() == 0 else None
    saved, epochs = hvd.broadcast_object((saved, spec.data.saved_history() if saved else []), root_rank=0)
    if saved is None:
        return None
    history.epochs = list(epochs)
    path = os.path.join(scratch, "resume.ckpt")
    with open(path, "wb") as file:
        file.write(saved)
    return path


class _History(Callback):
    """One entry per epoch: ``{"epoch": N, METRIC: value}`` of what the module logged, averaged over the ranks."""

    def __init__(self, hvd: Any) -> None:
        self.hvd, self.epochs = hvd, []

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        import torch

        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if torch.as_tensor(v).numel() == 1}
        names = sorted(self.hvd.broadcast_object(sorted(metrics), root_rank=0))
        values = torch.tensor([metrics.get(name, float("nan")) for name in names], dtype=torch.float64)
        averaged = self.hvd.allreduce(values, name="lightning_epoch_logs").tolist() if names else []
        self.epochs.append({"epoch": trainer.current_epoch, **dict(zip(names, averaged, strict=True))})


class _Checkpoint(Callback):
    """After every epoch: a Lightning checkpoint (collective), saved by rank 0 into the run folder."""

    def __init__(self, spec: LightningSpec, history: _History, path: str) -> None:
        self.spec, self.history, self.path = spec, history, path

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        trainer.save_checkpoint(self.path)
        if trainer.global_rank == 0:
            with open(self.path, "rb") as file:
                self.spec.data.save(file.read(), self.history.epochs)


__all__ = ["LightningSpec", "train"]
