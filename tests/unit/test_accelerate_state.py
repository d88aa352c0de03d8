"""hvdlite's correction of Accelerate's backend choice (hvdlite.torch.distributed.accelerate_state)."""

import subprocess
import sys

import pytest
from accelerate.utils import DistributedType as Kind

from hvdlite.torch.distributed.accelerate_state import choose


@pytest.mark.parametrize(("chosen", "asked", "cpu", "world", "cuda", "expected"), [
    # Several ranks on CPU without cpu=True: Accelerate stays non-distributed; hvdlite makes it data-parallel
    ((None, Kind.NO), None, False, 2, False, ("hvdlite", Kind.MULTI_CPU)),
    (("hvdlite", Kind.NO), "hvdlite", False, 3, False, ("hvdlite", Kind.MULTI_CPU)),
    # cpu=True with hvdlite named: Accelerate swaps in gloo (then refuses its own swap)
    (("gloo", Kind.MULTI_CPU), "hvdlite", True, 2, False, ("hvdlite", Kind.MULTI_CPU)),
    # cpu=True, nothing named: the label says what runs
    (("gloo", Kind.MULTI_CPU), None, True, 2, False, ("hvdlite", Kind.MULTI_CPU)),
    # a backend the user named stays named (the torchrun mode runs it on hvdlite)
    (("gloo", Kind.MULTI_CPU), "gloo", True, 2, False, ("gloo", Kind.MULTI_CPU)),
    # GPUs: the same, on hvdlite's GPU plane
    (("nccl", Kind.MULTI_GPU), None, False, 2, True, ("hvdlite", Kind.MULTI_GPU)),
    (("hvdlite", Kind.NO), "hvdlite", True, 2, True, ("hvdlite", Kind.MULTI_CPU)),
    # one process, nothing named: Accelerate's choice stands
    ((None, Kind.NO), None, False, 1, False, (None, Kind.NO)),
    # one process with hvdlite named: a group of one, as with any other backend named
    (("hvdlite", Kind.NO), "hvdlite", False, 1, False, ("hvdlite", Kind.MULTI_CPU)),
    # what hvdlite does not stand for is left alone
    (("xla", Kind.XLA), None, False, 2, False, ("xla", Kind.XLA)),
])
def test_choose(chosen, asked, cpu, world, cuda, expected):
    assert choose(chosen, asked, cpu, world, cuda, Kind) == expected


@pytest.mark.parametrize("order", ["hvdlite first", "accelerate first"])
def test_the_correction_is_installed_whichever_is_imported_first(order):
    imports = ["import hvdlite.torch", "import accelerate.state"]
    code = "; ".join([*(imports if order == "hvdlite first" else imports[::-1]),
                      "print(getattr(accelerate.state.PartialState._prepare_backend, '_hvdlite', False))"])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.stdout.strip() == "True", result.stderr
