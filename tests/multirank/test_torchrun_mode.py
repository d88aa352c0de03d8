"""``hvdliterun --torch-backend hvdlite``: a script written for torchrun (scripts/torchrun_ddp.py, no
hvdlite line) runs unchanged on hvdlite's backend, and trains as it does under torchrun on gloo."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch

from .harness import ONE_THREAD, SCRIPTS, run_job

pytestmark = pytest.mark.multirank
SCRIPT = str(SCRIPTS / "torchrun_ddp.py")
TORCHRUN_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                  "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _hvdliterun(np: int, backend: str, out: str):
    result = run_job(["--torch-backend", "hvdlite", "python", SCRIPT, backend, out], np=np, timeout=240)
    assert result.returncode == 0, result.output
    return result


def _python(args: list[str], timeout: float = 240) -> str:
    """A plain Python run of the script's arguments (torchrun, or one process), killed past ``timeout``."""
    process = subprocess.Popen([sys.executable, *args], env={**os.environ, **ONE_THREAD}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError(f"{args} did not finish within {timeout} s: {process.communicate()[0]}") from None
    assert process.returncode == 0, output
    return output


def _variables(line: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in line.removeprefix("variables ").split())


def _same(a: dict, b: dict, exact: bool) -> None:
    for key in a:
        close = torch.equal(a[key], b[key]) if exact else torch.allclose(a[key], b[key], rtol=1e-5, atol=1e-6)
        assert close, (key, (a[key] - b[key]).abs().max().item())


def test_a_torchrun_script_runs_unchanged_on_hvdlite_and_trains_as_on_gloo(tmp_path):
    result = _hvdliterun(2, "gloo", str(tmp_path / "hvdlite.pt"))
    torchrun = _python(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", SCRIPT, "gloo",
                        str(tmp_path / "gloo.pt")])
    for rank in range(2):
        lines = result.lines(rank)
        assert "backend hvdlite sub-group hvdlite" in lines and "torchrun script ok" in lines, result.output
        given = _variables(next(line for line in lines if line.startswith("variables ")))
        assert {name for name in TORCHRUN_NAMES if given[name] != "<unset>"} == set(TORCHRUN_NAMES), given
        assert (given["RANK"], given["LOCAL_RANK"], given["WORLD_SIZE"]) == (str(rank), str(rank), "2"), given
    # The same variables torchrun gives (its values differ where they are its own: the run id, the store)
    theirs = _variables(next(line for line in torchrun.splitlines() if line.startswith("variables ")))
    assert {n for n, v in theirs.items() if v != "<unset>"} == {n for n, v in given.items() if v != "<unset>"}
    # Children inherit the rank's variables, not the mode: no second hvdlite start
    assert "child RANK=0 mode=<unset> bootstrap=False hvdlite=False" in result.lines(0), result.output
    _same(torch.load(tmp_path / "hvdlite.pt"), torch.load(tmp_path / "gloo.pt"), exact=True)


def test_a_device_map_backend_at_an_odd_size_trains_as_one_process(tmp_path):
    result = _hvdliterun(3, "cpu:gloo,cuda:nccl", str(tmp_path / "hvdlite.pt"))
    assert all("backend hvdlite sub-group " + ("hvdlite" if rank in (0, 2) else "-") in result.lines(rank)
               for rank in range(3)), result.output
    _python([SCRIPT, "single", str(tmp_path / "single.pt")])
    _same(torch.load(tmp_path / "hvdlite.pt"), torch.load(tmp_path / "single.pt"), exact=False)
