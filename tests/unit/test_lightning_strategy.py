"""strategy="hvdlite" in Lightning's registries (hvdlite.torch.distributed.lightning_strategy)."""

import subprocess
import sys

import pytest

CHECK = ("from lightning.pytorch.strategies import StrategyRegistry, DDPStrategy; "
         "from lightning.fabric.strategies import STRATEGY_REGISTRY; "
         "t, f = StrategyRegistry['hvdlite'], STRATEGY_REGISTRY['hvdlite']; "
         "print(issubclass(t['strategy'], DDPStrategy), t['init_params'], f['init_params'])")


@pytest.mark.parametrize("first", ["hvdlite.torch", "lightning"])
def test_the_strategy_is_registered_whichever_is_imported_first(first):
    second = "lightning" if first == "hvdlite.torch" else "hvdlite.torch"
    code = f"import {first}; import {second}; {CHECK}"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.stdout.strip().splitlines()[-1:] == [
        "True {'process_group_backend': 'hvdlite'} {'process_group_backend': 'hvdlite'}"], result.stderr
