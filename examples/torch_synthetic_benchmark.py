"""Synthetic training throughput with hvdlite.torch: Horovod's pytorch_synthetic_benchmark.py, on CPU.

Run:  hvdliterun -np 2 python examples/torch_synthetic_benchmark.py [--model mlp|resnet] [--fp16-allreduce]

Same flags and output lines as Horovod's ``examples/pytorch/pytorch_synthetic_benchmark.py``
(``Number of CPUs`` instead of ``Number of GPUs`` when it runs on CPU, as there). torchvision is not
needed: the two models are defined here, and the defaults are small so a run takes seconds on CPU.
Adasum is not offered; ``--threads`` (default 1) sets torch's threads per rank.
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import hvdlite.torch as hvd


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="PyTorch Synthetic Benchmark",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                        help="use fp16 compression during allreduce")
    parser.add_argument("--model", choices=("resnet", "mlp"), default="resnet", help="model to benchmark")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
    parser.add_argument("--num-warmup-batches", type=int, default=2,
                        help="number of warm-up batches that don't count towards benchmark")
    parser.add_argument("--num-batches-per-iter", type=int, default=5,
                        help="number of batches per benchmark iteration")
    parser.add_argument("--num-iters", type=int, default=5, help="number of benchmark iterations")
    parser.add_argument("--num-classes", type=int, default=10, help="number of output classes")
    parser.add_argument("--image-size", type=int, default=32, help="height and width of the synthetic images")
    parser.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per rank (ranks share the machine's cores)")
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    return args


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a shortcut; a 1x1 projection when the shape changes."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def small_resnet(num_classes: int, widths: tuple[int, ...] = (16, 32, 64)) -> nn.Module:
    """A CIFAR-style ResNet: a stem, one residual block per stage (each halving the resolution), a linear head."""
    layers: list[nn.Module] = [nn.Conv2d(3, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]),
                               nn.ReLU()]
    in_channels = widths[0]
    for index, width in enumerate(widths):
        layers.append(BasicBlock(in_channels, width, stride=1 if index == 0 else 2))
        in_channels = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_channels, num_classes)]
    return nn.Sequential(*layers)


def mlp(image_size: int, num_classes: int, hidden: int = 512) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * image_size * image_size, hidden), nn.ReLU(),
                         nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


def build_model(args: argparse.Namespace) -> nn.Module:
    if args.model == "mlp":
        return mlp(args.image_size, args.num_classes)
    return small_resnet(args.num_classes)


def build_optimizer(model: nn.Module, args: argparse.Namespace) -> torch.optim.Optimizer:
    # The averaged gradient comes from size() times the batch, so the learning rate scales with it.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    # fp16 halves the bytes each gradient puts on the wire; the sum itself runs in float32.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average)
    # Every rank starts from rank 0's weights and optimizer state, so they stay identical.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return optimizer


def log(message: str) -> None:
    if hvd.rank() == 0:
        print(message, flush=True)


def run(args: argparse.Namespace, model: nn.Module, optimizer: torch.optim.Optimizer) -> list[float]:
    """Warm up, then time ``num_iters`` iterations; returns images per second per rank for each."""
    # One fixed batch: the benchmark measures compute and communication, not data loading.
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, args.num_classes, (args.batch_size,))
    if args.cuda:
        data, target = data.cuda(), target.cuda()

    def benchmark_step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    device = "GPU" if args.cuda else "CPU"
    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    log("Running benchmark...")
    img_secs = []
    for iteration in range(args.num_iters):
        elapsed = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_secs.append(args.batch_size * args.num_batches_per_iter / elapsed)
        log(f"Iter #{iteration}: {img_secs[-1]:.1f} img/sec per {device}")
    return img_secs


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    hvd.init()
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())  # one GPU per rank on each machine
    model = build_model(args)
    if args.cuda:
        model.cuda()
    optimizer = build_optimizer(model, args)
    device = "GPU" if args.cuda else "CPU"
    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of {device}s: {hvd.size()}")
    img_secs = run(args, model, optimizer)
    mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
    log(f"Img/sec per {device}: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")


if __name__ == "__main__":
    main()
