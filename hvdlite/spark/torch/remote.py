"""What every rank of a ``TorchEstimator`` fit runs: Horovod's torch training loop on hvdlite.

As Horovod's: the optimizer is rebuilt on the rank's copy of the model with its learning rate
multiplied by the number of ranks, the model and optimizer are broadcast from rank 0, each epoch
is ``steps`` batches of the rank's share, losses and metrics are averaged over the ranks, and rank
0 saves a checkpoint into the run folder after every epoch (with the learning rate as given, so a
resume at another size scales it again). The history is Horovod's: one entry per epoch,
``{"epoch": N, "train": {"loss": ..., METRIC: ...}, "validation": {...}}``. With ``use_gpu`` each
rank trains on its local rank's GPU where every rank has one (:mod:`hvdlite.spark.common.device`);
checkpoints and what rank 0 returns hold CPU tensors either way.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable, Iterator
from typing import Any

from ..common.device import agreed_uses_gpu
from ..common.spec import Batch, DataSpec
from ..estimator import label_mismatch


@dataclasses.dataclass
class TrainSpec:
    """Everything a rank needs, pickled to it."""

    data: DataSpec
    model: bytes
    optimizer_cls: type
    optimizer_state: dict[str, Any]
    losses: list[Callable[..., Any]]
    loss_weights: list[float]
    metrics: list[Callable[..., Any]]
    input_shapes: list[list[int]] | None
    compression: Any
    backward_passes_per_step: int
    train_minibatch_fn: Callable[..., Any] | None
    use_gpu: bool = True


def train(spec: TrainSpec) -> dict[str, Any] | None:
    """Train on this rank; rank 0 returns the history and the trained model's and optimizer's states."""
    import cloudpickle
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    data = spec.data
    if data.seed is not None:
        torch.manual_seed(data.seed)
    device = _device(spec.use_gpu, hvd)
    model = cloudpickle.loads(spec.model).to(device)
    optimizer = spec.optimizer_cls(model.parameters(), lr=1.0)  # over the parameters on their device
    optimizer.load_state_dict(_scaled_lr(spec.optimizer_state, hvd.size()))
    history = _resume(spec, model, optimizer, hvd)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=spec.compression or hvd.Compression.none,
                                         backward_passes_per_step=spec.backward_passes_per_step)
    train_batches = _tensor_batches(spec, data.train_batches(hvd.rank(), hvd.size()), device)
    val_batches = data.val_batches(hvd.rank(), hvd.size())
    val_batches = None if val_batches is None else _tensor_batches(spec, val_batches, device)
    for epoch in range(len(history), len(history) + data.epochs):  # a resumed run: epochs more, as Horovod
        model.train()
        logs = {"epoch": epoch, "train": _epoch(spec, model, optimizer, train_batches, data.steps, "train", hvd)}
        if val_batches is not None:
            model.eval()
            with torch.no_grad():
                logs["validation"] = _epoch(spec, model, None, val_batches, data.val_steps, "validation", hvd)
        history.append(logs)
        if hvd.rank() == 0:
            _save(spec, model, optimizer, history, hvd.size())
            if data.verbose:
                print(logs, flush=True)
    if hvd.rank() != 0:
        return None
    return {"history": history, "model": _on_cpu(model.state_dict()),
            "optimizer": _on_cpu(_scaled_lr(optimizer.state_dict(), 1 / hvd.size()))}


def _device(use_gpu: bool, hvd: Any) -> Any:
    """This rank's device: its local rank's GPU where ``use_gpu`` and every rank has one, else the CPU."""
    import torch

    gpus = torch.cuda.device_count() if use_gpu else 0
    if not agreed_uses_gpu(use_gpu, hvd.local_rank(), gpus):
        return torch.device("cpu")
    torch.cuda.set_device(hvd.local_rank())
    return torch.device("cuda", hvd.local_rank())


def _on_cpu(value: Any) -> Any:
    """``value`` (a state dict, nested) with its tensors on the CPU: what the driver and the
    checkpoint get, loadable where there is no GPU."""
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda item: item.detach().cpu().clone() if isinstance(item, torch.Tensor) else item, value)


def _epoch(spec: TrainSpec, model: Any, optimizer: Any, batches: Iterator[tuple[list[Any], list[Any], Any]],
           steps: int, stage: str, hvd: Any) -> dict[str, float]:
    """``steps`` steps (training with an optimizer, else evaluation); the loss and metrics averaged
    over the steps and the ranks."""
    import torch

    totals: dict[str, float] = {}
    transform_outputs, loss_fn = _transform_outputs(spec), _loss_fn(spec)  # once per epoch, not per step
    for _ in range(steps):
        inputs, labels, weights = next(batches)
        if optimizer is not None:
            outputs, loss = (spec.train_minibatch_fn or _train_minibatch)(
                model, optimizer, transform_outputs, loss_fn, inputs, labels, weights)
        else:
            outputs, labels = transform_outputs(model(*inputs), labels)
            loss = loss_fn(outputs, labels, weights)
        for name, value in _step_values(spec, float(loss.detach()), outputs, labels).items():
            totals[name] = totals.get(name, 0.0) + value / steps
    names = sorted(totals)  # the same order on every rank
    averaged = hvd.allreduce(torch.tensor([totals[n] for n in names], dtype=torch.float64), name=f"{stage}_epoch_logs")
    return dict(zip(names, averaged.tolist(), strict=True))


def _train_minibatch(model: Any, optimizer: Any, transform_outputs: Callable[..., Any], loss_fn: Callable[..., Any],
                     inputs: list[Any], labels: list[Any], sample_weights: Any) -> tuple[Any, Any]:
    """Horovod's default step; ``train_minibatch_fn`` replaces it with the same signature."""
    optimizer.zero_grad()
    outputs, labels = transform_outputs(model(*inputs), labels)
    loss = loss_fn(outputs, labels, sample_weights)
    loss.backward()
    optimizer.step()
    return outputs, loss


def _transform_outputs(spec: TrainSpec) -> Callable[[Any, list[Any]], tuple[list[Any], list[Any]]]:
    """``(outputs, labels) -> (outputs as a list, each label in its output's shape)``."""
    def transform(outputs: Any, labels: list[Any]) -> tuple[list[Any], list[Any]]:
        outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        return outputs, [label_like(label, output, name)
                         for label, output, name in zip(labels, outputs, spec.data.label_cols, strict=True)]
    return transform


def _loss_fn(spec: TrainSpec) -> Callable[[list[Any], list[Any], Any], Any]:
    """``(outputs, labels, sample_weights) -> loss``: each label's loss, weighted, summed."""
    losses = spec.losses if len(spec.losses) > 1 else spec.losses * len(spec.data.label_cols)

    def loss_fn(outputs: list[Any], labels: list[Any], weights: Any) -> Any:
        total = 0
        for output, label, loss, weight in zip(outputs, labels, losses, spec.loss_weights, strict=True):
            if weights is None:
                total = total + loss(output, label) * weight
            else:
                total = total + (loss(output, label, reduction="none").flatten() * weights).mean() * weight
        return total
    return loss_fn


def _step_values(spec: TrainSpec, loss: float, outputs: list[Any], labels: list[Any]) -> dict[str, float]:
    values = {"loss": loss}
    for metric in spec.metrics:
        for output, label, column in zip(outputs, labels, spec.data.label_cols, strict=True):
            name = getattr(metric, "__name__", type(metric).__name__)
            values[f"{name}_{column}" if len(outputs) > 1 else name] = float(metric(output.detach(), label))
    return values


def _tensor_batches(spec: TrainSpec, batches: Iterator[Batch], device: Any) -> Iterator[tuple[list[Any], list[Any], Any]]:
    """Each batch as ``(inputs, labels, sample_weights)`` tensors on ``device``: Horovod's step arguments."""
    import torch

    def tensor(values: Any) -> Any:
        result = torch.as_tensor(values)
        return (result.float() if result.dtype == torch.float64 else result).to(device)

    data = spec.data
    for batch in batches:
        inputs = [tensor(batch[name]) for name in data.feature_cols]
        if spec.input_shapes:
            inputs = [value.reshape(shape) for value, shape in zip(inputs, spec.input_shapes, strict=True)]
        labels = [tensor(batch[name]) for name in data.label_cols]
        yield inputs, labels, tensor(batch[data.sample_weight_col]) if data.sample_weight_col else None


def label_like(label: Any, output: Any, column: str) -> Any:
    """``label`` in the shape of the model's ``output`` (one value per row, a class index, stays a
    vector), or a ValueError naming both shapes."""
    if label.shape == output.shape:
        return label
    message = label_mismatch(tuple(label.shape[1:]), tuple(output.shape[1:]), column)
    if message:
        raise ValueError(message)
    return label.reshape(output.shape) if label.numel() == output.numel() else label.reshape(len(label))


def _scaled_lr(state: dict[str, Any], factor: float) -> dict[str, Any]:
    groups = [{**group, "lr": group["lr"] * factor} for group in state["param_groups"]]
    return {**state, "param_groups": groups}


def _save(spec: TrainSpec, model: Any, optimizer: Any, history: list[dict[str, Any]], size: int) -> None:
    import torch

    buffer = io.BytesIO()
    torch.save(_on_cpu({"model": model.state_dict(), "optimizer": _scaled_lr(optimizer.state_dict(), 1 / size)}), buffer)
    spec.data.save(buffer.getvalue(), history)


def _resume(spec: TrainSpec, model: Any, optimizer: Any, hvd: Any) -> list[dict[str, Any]]:
    """The history so far (one entry per finished epoch): from the run's checkpoint if it has one
    (read by rank 0), then the model and optimizer broadcast from rank 0 either way."""
    import torch

    history = []
    saved = spec.data.saved_checkpoint() if hvd.rank() == 0 else None
    if saved is not None:
        checkpoint = torch.load(io.BytesIO(saved), weights_only=False, map_location="cpu")  # loads onto the model's device
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(_scaled_lr(checkpoint["optimizer"], hvd.size()))
        history = spec.data.saved_history()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return hvd.broadcast_object(history, root_rank=0)


__all__ = ["TrainSpec", "train", "label_like"]
