"""The trainers teams train with, unchanged under ``hvdliterun --torch-backend hvdlite``: Hugging Face
``Accelerator`` and ``Trainer``, Lightning's ``Trainer``, ``Fabric`` and ``ModelParallelStrategy``.
Each ends with the parameters of the same script under torchrun on gloo, bit for bit, and of one
process on the whole batch within float rounding."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import pytest
import torch

from .harness import SCRIPTS, JobResult, run_job
from .test_torchrun_mode import _python, _same

pytestmark = pytest.mark.multirank
ACCELERATE, HF_TRAINER, LIGHTNING = (str(SCRIPTS / name) for name in
                                     ("accelerate_train.py", "hf_trainer.py", "lightning_train.py"))
LIGHTNING_KINDS = ("trainer", "fabric", "fsdp2")


def _hvdliterun(np: int, args: list[str], mode: bool = True, env: dict[str, str] | None = None,
                expect_ok: bool = True):
    result = run_job([*(["--torch-backend", "hvdlite"] if mode else []), "python", *args], np=np, env=env,
                     timeout=300)
    assert (result.returncode == 0) == expect_ok, result.output
    return result


def _torchrun(np: int, args: list[str]) -> str:
    return _python(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(np), *args])


def _trains_as_gloo_and_one_process(tmp_path, script: str, setups: tuple[str, str, list[str]], ok: str,
                                    tolerance: dict[str, float] | None = None) -> None:
    """``script`` with its hvdlite setup under the torchrun mode at np=2, its gloo setup under
    torchrun, and ``[setup, *args]`` in one process: the first two bit for bit, the last within rounding.
    ``ok``: what each rank prints, with ``{backend}`` and ``{rank}``."""
    hvdlite_setup, gloo_setup, single_args = setups
    out = {name: str(tmp_path / f"{name}.pt") for name in ("hvdlite", "gloo", "single")}
    result = _hvdliterun(2, [script, hvdlite_setup, out["hvdlite"]])
    for rank in range(2):
        assert ok.format(backend="hvdlite", rank=rank) in result.lines(rank), result.output
    assert ok.format(backend="gloo", rank=0) in _torchrun(2, [script, gloo_setup, out["gloo"]])
    _python([script, single_args[0], out["single"], *single_args[1:]])
    _same_as_gloo_and_close_to_one_process(out, tolerance)


def _same_as_gloo_and_close_to_one_process(out: dict[str, str], tolerance: dict[str, float] | None = None) -> None:
    """The parameters saved at ``out["hvdlite"]`` equal ``out["gloo"]``'s bit for bit and
    ``out["single"]``'s within rounding."""
    hvdlite, single = torch.load(out["hvdlite"]), torch.load(out["single"])
    _same(hvdlite, torch.load(out["gloo"]), exact=True)
    for key, value in hvdlite.items():
        assert torch.allclose(value, single[key], **(tolerance or {"rtol": 1e-5, "atol": 1e-6})), key


@functools.cache
def _lightning_runs(folder: str) -> tuple[JobResult, str, str]:
    """lightning_train.py's kinds, all in each of three runs (Lightning's start is seconds of CPU a
    process): under the torchrun mode on hvdlite at np=2, under torchrun on gloo, and in one process;
    the parameters go to ``folder/{hvdlite,gloo,single}.KIND.pt``. The hvdlite job, the output of the
    other two, and ``folder``."""
    kinds = ",".join(LIGHTNING_KINDS)
    result = _hvdliterun(2, [LIGHTNING, kinds, f"{folder}/hvdlite"])
    others = _torchrun(2, [LIGHTNING, kinds, f"{folder}/gloo"]) + _python([LIGHTNING, kinds, f"{folder}/single", "single"])
    return result, others, folder


@pytest.fixture(scope="module")
def lightning_runs(tmp_path_factory) -> Callable[[], tuple[JobResult, str, str]]:
    """The Lightning runs this file's tests share, made for the first test that asks."""
    folder = str(tmp_path_factory.mktemp("lightning"))
    return lambda: _lightning_runs(folder)


def test_accelerate_trains_data_parallel_on_hvdlite_as_on_gloo(tmp_path):
    # Accelerator() with no hvdlite line, against Accelerator(cpu=True) under torchrun
    _trains_as_gloo_and_one_process(tmp_path, ACCELERATE, ("plain", "cpu", ["single"]),
                                    "accelerate ok MULTI_CPU {backend} rank {rank} of 2")


@pytest.mark.parametrize("setup", ["named", "initialized"])
def test_accelerate_with_hvdlite_never_trains_each_rank_alone(tmp_path, setup):
    # PartialState(backend="hvdlite") without cpu=True, or hvd.init() then Accelerator(), on CPU:
    # Accelerate used to stay non-distributed, each rank training alone (exit 0). Now
    # data-parallel, also without the torchrun mode.
    named, single = str(tmp_path / "named.pt"), str(tmp_path / "single.pt")
    result = _hvdliterun(3, [ACCELERATE, setup, named], mode=False)
    for rank in range(3):
        assert f"accelerate ok MULTI_CPU hvdlite rank {rank} of 3" in result.lines(rank), result.output
    _python([ACCELERATE, "single", single])
    _same(torch.load(named), torch.load(single), exact=False)


def test_hugging_face_trainer_trains_a_gpt2_on_hvdlite_as_on_gloo(tmp_path):
    # TrainingArguments() as on a GPU machine, against use_cpu=True under torchrun; Adam's steps
    # make the rounding differences from one process grow a little
    _trains_as_gloo_and_one_process(tmp_path, HF_TRAINER, ("plain", "cpu", ["single"]),
                                    "trainer ok DISTRIBUTED {backend} rank {rank} of 2", {"rtol": 1e-4, "atol": 1e-5})


def test_a_stopped_rank_in_a_trainer_job_is_named_on_every_other_rank(tmp_path):
    timeout = 5
    result = _hvdliterun(3, [HF_TRAINER, "plain", str(tmp_path / "x.pt"), "1"],
                         env={"HVDLITE_COMM_TIMEOUT_SECONDS": str(timeout)}, expect_ok=False)
    assert "step 1 done" in result.lines(1), result.output
    for rank in (0, 2):
        assert any(re.search(rf"rank {rank}: .* made no progress for {timeout} s .*rank\(s\) \[1\] did not answer",
                             line) for line in result.lines(rank)), result.output


@pytest.mark.parametrize("kind", LIGHTNING_KINDS)
def test_lightning_trains_on_hvdlite_as_on_gloo(lightning_runs, kind):
    result, others, folder = lightning_runs()
    for rank in range(2):
        assert f"lightning {kind} ok backend hvdlite rank {rank}" in result.lines(rank), result.output
    assert f"lightning {kind} ok backend gloo rank 0" in others, others
    assert f"lightning {kind} ok backend None rank 0" in others, others
    _same_as_gloo_and_close_to_one_process({name: f"{folder}/{name}.{kind}.pt" for name in ("hvdlite", "gloo", "single")})


def test_lightning_strategy_hvdlite_trains_at_an_odd_size_as_one_process(tmp_path, lightning_runs):
    # Trainer(strategy="hvdlite") with devices left alone, under plain hvdliterun: hvdlite starts
    # itself and gives each host's ranks their processes, as Horovod's strategy did.
    named = str(tmp_path / "named")
    result = _hvdliterun(3, [LIGHTNING, "named", named], mode=False)
    for rank in range(3):
        assert f"lightning named ok backend hvdlite rank {rank}" in result.lines(rank), result.output
    *_, folder = lightning_runs()  # one process's Trainer with DDP on the whole batch: the same steps
    _same(torch.load(named + ".named.pt"), torch.load(f"{folder}/single.trainer.pt"), exact=False)
