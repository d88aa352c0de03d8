"""``hvdliterun --check-build``: which frameworks, controllers and tensor operations are available."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator, Mapping

from hvdlite.gpu import stack

FRAMEWORKS = (("PyTorch", "torch"), ("TensorFlow", "tensorflow"), ("JAX", "jax"))


@contextlib.contextmanager
def _quiet_native_output() -> Iterator[None]:
    """Send what native code writes to stdout and stderr nowhere meanwhile: TensorFlow's C++ start-up
    log (written to file descriptor 2 before any Python-side setting applies) would come before the report."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)


def _adapter_usable(framework: str) -> bool:
    if importlib.util.find_spec(framework) is None:
        return False
    try:
        with _quiet_native_output():
            importlib.import_module(f"hvdlite.{framework}")
    except ImportError:
        return False
    return True


def schedulers(env: Mapping[str, str]) -> list[str]:
    """The schedulers hvdliterun finds in ``env``, one line each, as it would use them."""
    from .cluster.slurm import SlurmError, allocation_hosts, describe, in_allocation
    from .mpi_job import MpiJobError
    from .mpi_job import detect as detect_mpi_job

    lines = []
    if in_allocation(env):
        try:
            slots = sum(host.slots for host in allocation_hosts(env))
            lines.append(f"[X] Slurm: {describe(env)}: {slots} task slot(s); proxies start with srun")
        except SlurmError as exc:
            lines.append(f"[!] Slurm: {exc}")
    try:
        job = detect_mpi_job(env)
        if job is not None:
            lines.append(f"[X] Kubernetes MPI job: {job.describe()}")
    except MpiJobError as exc:
        lines.append(f"[!] Kubernetes MPI job: {exc}")
    return lines or ["[ ] none (hosts come from -H, --hostfile or this machine)"]


ENGINES = (("Spark", "pyspark", "spark"), ("Ray", "ray", "ray"))


def engines() -> list[str]:
    """One line per engine hvdlite can run inside, with the installed version (found, not imported:
    importing Ray or PySpark takes seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    lines = []
    for label, package, extra in ENGINES:
        try:
            lines.append(f"[X] {label} ({package} {version(package)})")
        except PackageNotFoundError:
            lines.append(f"[ ] {label} (pip install 'hvdlite[{extra}]')")
    return lines


def report(env: Mapping[str, str] | None = None) -> str:
    """Horovod-style availability report, with the schedulers found in ``env``."""
    import hvdlite

    def box(flag: bool) -> str:
        return "[X]" if flag else "[ ]"

    lines = [f"hvdlite v{hvdlite.__version__}:", "", "Available Frameworks:"]
    lines += [f"    {box(_adapter_usable(module))} {label}" for label, module in FRAMEWORKS]
    lines += ["", "Available Controllers:", f"    {box(True)} MPI", f"    {box(False)} Gloo", "",
              "Available Tensor Operations:", f"    {box(hvdlite.nccl_built() > 0)} NCCL",
              f"    {box(True)} MPI", f"    {box(False)} Gloo", "",
              "Available Reduce Ops:", "    Average, Sum, Min, Max, Product, Adasum", "",
              "Available Engines (hvdlite.spark, hvdlite.ray):", *(f"    {line}" for line in engines()), "",
              "Detected Schedulers:", *(f"    {line}" for line in schedulers(env or {})), "",
              "CUDA stack:", *(f"    {line}" for line in stack.describe(_torch_cuda()))]
    return "\n".join(lines)


def _torch_cuda() -> str | None:
    """The CUDA version torch was built for (None: no torch, or a CPU build)."""
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch.version.cuda
