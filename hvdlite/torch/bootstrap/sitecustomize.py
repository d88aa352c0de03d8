"""Run by Python at the start of each rank that ``hvdliterun --torch-backend hvdlite`` started
(this directory leads the rank's ``PYTHONPATH``): hvdliterun's torchrun mode, before the script's
first line (:mod:`hvdlite.torch.distributed.torchrun`). Its children do not run it again.

Python imports one ``sitecustomize``: the one this shadows (a distribution's, a user's) is run next.
"""

import importlib.util
import os
import sys


def _run_shadowed() -> None:
    """Run the next ``sitecustomize`` on the path, as if this one were not there."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if entry and os.path.abspath(entry) != here and os.path.isfile(os.path.join(entry, "sitecustomize.py")):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize",
                                                          os.path.join(entry, "sitecustomize.py"))
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


def _start() -> None:
    """The mode, or the end of this process: Python reports a failing ``sitecustomize`` and goes on,
    and the script would then run without the mode (each rank alone, or torch's rendezvous error)."""
    try:
        from hvdlite.torch.distributed.torchrun import start
    except ImportError as error:  # torch, or hvdlite itself, is not importable by this Python
        raise SystemExit(f"hvdliterun --torch-backend hvdlite: this rank's Python ({sys.executable}) cannot "
                         f"import hvdlite.torch: {error}") from None
    try:
        start()
    except Exception as error:  # noqa: BLE001 - any failure ends the rank, naming the mode
        raise SystemExit(f"hvdliterun --torch-backend hvdlite: starting hvdlite in this rank failed: "
                         f"{type(error).__name__}: {error}") from None


_run_shadowed()
_start()
