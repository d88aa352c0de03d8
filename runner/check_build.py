"""``hvdliterun --check-build``: which frameworks, controllers and tensor operations are available."""

from __future__ import annotations

import importlib
import importlib.util

FRAMEWORKS = (("PyTorch", "torch"), ("TensorFlow", "tensorflow"), ("JAX", "jax"))


def _adapter_usable(framework: str) -> bool:
    if importlib.util.find_spec(framework) is None:
        return False
    try:
        importlib.import_module(f"hvdlite.{framework}")
    except ImportError:
        return False
    return True


def report() -> str:
    """Horovod-style availability report."""
    import hvdlite

    def box(flag: bool) -> str:
        return "[X]" if flag else "[ ]"

    lines = [f"hvdlite v{hvdlite.__version__}:", "", "Available Frameworks:"]
    lines += [f"    {box(_adapter_usable(module))} {label}" for label, module in FRAMEWORKS]
    lines += ["", "Available Controllers:", f"    {box(True)} MPI", f"    {box(False)} Gloo", "",
              "Available Tensor Operations:", f"    {box(hvdlite.nccl_built() > 0)} NCCL",
              f"    {box(True)} MPI", f"    {box(False)} Gloo", "",
              "Available Reduce Ops:", "    Average, Sum, Min, Max, Product"]
    return "\n".join(lines)
