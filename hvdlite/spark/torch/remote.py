"""What every rank of a ``TorchEstimator`` fit runs: Horovod's torch training loop on hvdlite.

As Horovod's: the optimizer is rebuilt on the rank's copy of the model with its learning rate
multiplied by the number of ranks, the model and optimizer are broadcast from rank 0, each epoch
is ``steps`` batches of the rank's share, losses and metrics are averaged over the ranks, and rank
0 saves a checkpoint into the run folder after every epoch (with the learning rate as given, so a
resume at another size scales it again).
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable, Iterator
from typing import Any

from ..common.data import Batches
from ..common.store import Store


@dataclasses.dataclass
class TrainSpec:
    """Everything a rank needs, pickled to it."""

    model: bytes
    optimizer_cls: type
    optimizer_state: dict[str, Any]
    losses: list[Callable[..., Any]]
    loss_weights: list[float]
    metrics: list[Callable[..., Any]]
    feature_cols: list[str]
    label_cols: list[str]
    sample_weight_col: str | None
    columns: list[str]  # what the batches read: features, labels and weights, each once
    input_shapes: list[list[int]] | None
    store: Store
    run_id: str
    train_path: str
    val_path: str | None
    batch_size: int
    val_batch_size: int
    epochs: int
    steps: int
    val_steps: int
    shuffle_buffer_size: int
    seed: int | None
    verbose: int
    compression: Any
    backward_passes_per_step: int
    transformation_fn: Callable[[dict[str, Any]], dict[str, Any]] | None
    train_minibatch_fn: Callable[..., Any] | None
    inmemory_cache_all: bool


def train(spec: TrainSpec) -> dict[str, Any] | None:
    """Fit on this rank; rank 0 returns the history and the trained state, the others None."""
    import cloudpickle
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    if spec.seed is not None:
        torch.manual_seed(spec.seed)
    model = cloudpickle.loads(spec.model)
    optimizer = spec.optimizer_cls(model.parameters(), lr=1.0)
    optimizer.load_state_dict(_scaled_lr(spec.optimizer_state, hvd.size()))
    start, history = _resume(spec, model, optimizer, hvd)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=spec.compression or hvd.Compression.none,
                                         backward_passes_per_step=spec.backward_passes_per_step)
    train_batches = _batches(spec, spec.train_path, spec.batch_size, spec.shuffle_buffer_size, hvd)
    val_batches = _batches(spec, spec.val_path, spec.val_batch_size, 0, hvd) if spec.val_path else None
    for epoch in range(start, spec.epochs):
        model.train()
        logs = _epoch(spec, model, optimizer, train_batches, spec.steps, "", hvd)
        if val_batches is not None:
            model.eval()
            with torch.no_grad():
                logs.update(_epoch(spec, model, None, val_batches, spec.val_steps, "val_", hvd))
        for name, value in logs.items():
            history.setdefault(name, []).append(value)
        if hvd.rank() == 0:
            _save(spec, model, optimizer, epoch + 1, history, hvd.size())
            if spec.verbose:
                print(f"epoch {epoch + 1}/{spec.epochs}: " + ", ".join(f"{k}={v:.6g}" for k, v in logs.items()), flush=True)
    if hvd.rank() != 0:
        return None
    return {"history": history, "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "optimizer": _scaled_lr(optimizer.state_dict(), 1 / hvd.size())}


def _batches(spec: TrainSpec, path: str, batch_size: int, buffer: int, hvd: Any) -> Iterator[Any]:
    dataset = spec.store.get_parquet_dataset(path)
    return iter(Batches(dataset, spec.columns, hvd.rank(), hvd.size(), batch_size, buffer, spec.seed,
                        cache=spec.inmemory_cache_all))


def _epoch(spec: TrainSpec, model: Any, optimizer: Any, batches: Iterator[Any], steps: int, prefix: str,
           hvd: Any) -> dict[str, float]:
    """``steps`` steps (training with an optimizer, else evaluation); the averaged loss and metrics."""
    import torch

    totals: dict[str, float] = {}
    for _ in range(steps):
        batch = next(batches)
        if spec.transformation_fn is not None:
            batch = spec.transformation_fn(batch)
        inputs, labels, weights = _tensors(spec, batch)
        outputs = model(*inputs)
        outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        labels = [label_like(label, output, name) for label, output, name in zip(labels, outputs, spec.label_cols, strict=True)]
        if optimizer is not None and spec.train_minibatch_fn is not None:
            loss = spec.train_minibatch_fn(model, optimizer, inputs, labels, outputs, spec)
        else:
            loss = _loss(spec, outputs, labels, weights)
            if optimizer is not None:
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        step_values = {"loss": float(loss.detach())}
        for metric in spec.metrics:
            for output, label, column in zip(outputs, labels, spec.label_cols, strict=True):
                name = getattr(metric, "__name__", type(metric).__name__)
                step_values[f"{name}_{column}" if len(outputs) > 1 else name] = float(metric(output.detach(), label))
        for name, value in step_values.items():
            totals[prefix + name] = totals.get(prefix + name, 0.0) + value / steps
    names = sorted(totals)  # the same order on every rank
    averaged = hvd.allreduce(torch.tensor([totals[n] for n in names], dtype=torch.float64), name=f"{prefix}epoch_logs")
    return dict(zip(names, averaged.tolist(), strict=True))


def _tensors(spec: TrainSpec, batch: dict[str, Any]) -> tuple[list[Any], list[Any], Any]:
    import torch

    def tensor(values: Any) -> Any:
        result = torch.as_tensor(values)
        return result.float() if result.dtype == torch.float64 else result

    inputs = [tensor(batch[name]) for name in spec.feature_cols]
    if spec.input_shapes:
        inputs = [value.reshape(shape) for value, shape in zip(inputs, spec.input_shapes, strict=True)]
    labels = [tensor(batch[name]) for name in spec.label_cols]
    weights = tensor(batch[spec.sample_weight_col]) if spec.sample_weight_col else None
    return inputs, labels, weights


def label_like(label: Any, output: Any, column: str) -> Any:
    """``label`` in the shape of the model's ``output``, or a ValueError naming both shapes."""
    if label.shape == output.shape:
        return label
    if label.numel() != output.numel():
        raise ValueError(f"label column {column!r} has shape {tuple(label.shape[1:])} per row but the model's output "
                         f"for it has {tuple(output.shape[1:])}")
    return label.reshape(output.shape)


def _loss(spec: TrainSpec, outputs: list[Any], labels: list[Any], weights: Any) -> Any:
    losses = spec.losses if len(spec.losses) > 1 else spec.losses * len(outputs)
    total = 0
    for output, label, loss, weight in zip(outputs, labels, losses, spec.loss_weights, strict=True):
        if weights is None:
            total = total + loss(output, label) * weight
        else:
            total = total + (loss(output, label, reduction="none").flatten() * weights).mean() * weight
    return total


def _scaled_lr(state: dict[str, Any], factor: float) -> dict[str, Any]:
    groups = [{**group, "lr": group["lr"] * factor} for group in state["param_groups"]]
    return {**state, "param_groups": groups}


def _save(spec: TrainSpec, model: Any, optimizer: Any, epochs_done: int, history: dict[str, list[float]],
          size: int) -> None:
    import torch

    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": _scaled_lr(optimizer.state_dict(), 1 / size),
                "epochs_done": epochs_done}, buffer)
    spec.store.write(spec.store.get_checkpoint_path(spec.run_id), buffer.getvalue())
    spec.store.write(f"{spec.store.get_logs_path(spec.run_id)}/history.json", json.dumps(history).encode())


def _resume(spec: TrainSpec, model: Any, optimizer: Any, hvd: Any) -> tuple[int, dict[str, list[float]]]:
    """The epoch to start at and the history so far: from the run's checkpoint if it has one (read by
    rank 0), then the model and optimizer broadcast from rank 0 either way."""
    import torch

    found = None
    path = spec.store.get_checkpoint_path(spec.run_id)
    if hvd.rank() == 0 and path is not None and spec.store.exists(path):
        checkpoint = torch.load(io.BytesIO(spec.store.read(path)), weights_only=False)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(_scaled_lr(checkpoint["optimizer"], hvd.size()))
        history = json.loads(spec.store.read(f"{spec.store.get_logs_path(spec.run_id)}/history.json"))
        found = (checkpoint["epochs_done"], history)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    start, history = hvd.broadcast_object(found or (0, {}), root_rank=0)
    return start, history


__all__ = ["TrainSpec", "train", "label_like"]
