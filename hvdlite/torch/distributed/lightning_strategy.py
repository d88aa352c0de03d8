"""``strategy="hvdlite"`` for Lightning's ``Trainer`` and ``Fabric``, as Horovod's users wrote
``strategy="horovod"``: Lightning's DDP strategy on hvdlite's backend, which starts hvdlite itself.

Registered in Lightning's strategy registries by :func:`hvdlite.torch.distributed.register` (so after
``import hvdlite.torch``), before or after ``lightning`` is imported.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...utils.on_import import when_imported
from .process_group import BACKEND_NAME
from .started import started

DESCRIPTION = "DDP on hvdlite's torch.distributed backend (hvdlite.torch)"


def _strategy(ddp: type, setup_name: str) -> type:
    """A subclass of Lightning's ``ddp`` strategy that starts hvdlite before it makes its group."""

    def setup_environment(self: Any) -> None:
        local_size = started().topology.local_size  # hvd.init(), collective: every rank's strategy sets up here
        devices = self.parallel_devices or []
        if devices and len(devices) != local_size and all(d.type == "cpu" for d in devices):
            # devices="auto" is one CPU device: a process per rank of this host, as hvdliterun started them
            self.parallel_devices = [devices[0]] * local_size
        getattr(ddp, setup_name)(self)

    return type("HvdliteStrategy", (ddp,), {setup_name: setup_environment, "__doc__": DESCRIPTION})


def _register(module: ModuleType) -> None:
    registry = getattr(module, "StrategyRegistry", None) or module.STRATEGY_REGISTRY  # Trainer's, Fabric's
    if BACKEND_NAME not in registry:
        registry.register(BACKEND_NAME, _strategy(module.DDPStrategy, "setup_environment"),
                                         description=DESCRIPTION, process_group_backend=BACKEND_NAME)


def install() -> None:
    """Make ``strategy="hvdlite"`` known to Lightning's ``Trainer`` and ``Fabric``."""
    for name in ("lightning.pytorch.strategies", "lightning.fabric.strategies", "pytorch_lightning.strategies"):
        when_imported(name, _register)
