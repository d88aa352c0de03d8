"""The trainers teams train with, unchanged under ``hvdliterun --torch-backend hvdlite``: Hugging Face
``Accelerator`` and ``Trainer``, Lightning's ``Trainer``, ``Fabric`` and ``ModelParallelStrategy``.
Each ends with the parameters of the same script under torchrun on gloo, bit for bit, and of one
process on the whole batch within float rounding."""

from __future__ import annotations

import re

import pytest
import torch

from .harness import SCRIPTS, run_job
from .test_torchrun_mode import _python, _same

pytestmark = pytest.mark.multirank
ACCELERATE, HF_TRAINER, LIGHTNING = (str(SCRIPTS / name) for name in
                                     ("accelerate_train.py", "hf_trainer.py", "lightning_train.py"))


def _hvdliterun(np: int, args: list[str], mode: bool = True, env: dict[str, str] | None = None,
                expect_ok: bool = True):
    result = run_job([*(["--torch-backend", "hvdlite"] if mode else []), "python", *args], np=np, env=env,
                     timeout=300)
    assert (result.returncode == 0) == expect_ok, result.output
    return result


def _torchrun(np: int, args: list[str]) -> str:
    return _python(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(np), *args])


def test_accelerate_trains_data_parallel_on_hvdlite_as_on_gloo(tmp_path):
    out = {name: str(tmp_path / f"{name}.pt") for name in ("hvdlite", "gloo", "single")}
    result = _hvdliterun(2, [ACCELERATE, "plain", out["hvdlite"]])  # Accelerator(), no hvdlite line
    for rank in range(2):
        assert f"accelerate ok MULTI_CPU hvdlite rank {rank} of 2" in result.lines(rank), result.output
    assert "accelerate ok MULTI_CPU gloo" in _torchrun(2, [ACCELERATE, "cpu", out["gloo"]])
    _python([ACCELERATE, "single", out["single"]])
    hvdlite = torch.load(out["hvdlite"])
    _same(hvdlite, torch.load(out["gloo"]), exact=True)
    _same(hvdlite, torch.load(out["single"]), exact=False)


def test_accelerate_told_hvdlite_never_trains_each_rank_alone(tmp_path):
    # PartialState(backend="hvdlite") without cpu=True: Accelerate used to make the group and stay
    # non-distributed, each rank training alone (exit 0). Now data-parallel, also without the mode.
    named, single = str(tmp_path / "named.pt"), str(tmp_path / "single.pt")
    result = _hvdliterun(3, [ACCELERATE, "named", named], mode=False)
    for rank in range(3):
        assert f"accelerate ok MULTI_CPU hvdlite rank {rank} of 3" in result.lines(rank), result.output
    _python([ACCELERATE, "single", single])
    _same(torch.load(named), torch.load(single), exact=False)


def test_hugging_face_trainer_trains_a_gpt2_on_hvdlite_as_on_gloo(tmp_path):
    out = {name: str(tmp_path / f"{name}.pt") for name in ("hvdlite", "gloo", "single")}
    result = _hvdliterun(2, [HF_TRAINER, "plain", out["hvdlite"]])  # TrainingArguments() as on a GPU machine
    for rank in range(2):
        assert f"trainer ok DISTRIBUTED hvdlite rank {rank} of 2" in result.lines(rank), result.output
    assert "trainer ok DISTRIBUTED gloo" in _torchrun(2, [HF_TRAINER, "cpu", out["gloo"]])
    _python([HF_TRAINER, "single", out["single"]])
    hvdlite = torch.load(out["hvdlite"])
    _same(hvdlite, torch.load(out["gloo"]), exact=True)
    for key, value in hvdlite.items():  # Adam's steps: rounding differences grow a little
        assert torch.allclose(value, torch.load(out["single"])[key], rtol=1e-4, atol=1e-5), key


def test_a_stopped_rank_in_a_trainer_job_is_named_on_every_other_rank(tmp_path):
    timeout = 5
    result = _hvdliterun(3, [HF_TRAINER, "plain", str(tmp_path / "x.pt"), "1"],
                         env={"HVDLITE_COMM_TIMEOUT_SECONDS": str(timeout)}, expect_ok=False)
    assert "step 1 done" in result.lines(1), result.output
    for rank in (0, 2):
        assert any(re.search(rf"rank {rank}: .* made no progress for {timeout} s .*rank\(s\) \[1\] did not answer",
                             line) for line in result.lines(rank)), result.output


@pytest.mark.parametrize("kind", ["trainer", "fabric", "fsdp2"])
def test_lightning_trains_on_hvdlite_as_on_gloo(tmp_path, kind):
    out = {name: str(tmp_path / f"{name}.pt") for name in ("hvdlite", "gloo", "single")}
    result = _hvdliterun(2, [LIGHTNING, kind, out["hvdlite"]])
    for rank in range(2):
        assert f"lightning {kind} ok backend hvdlite rank {rank}" in result.lines(rank), result.output
    assert f"lightning {kind} ok backend gloo" in _torchrun(2, [LIGHTNING, kind, out["gloo"]])
    _python([LIGHTNING, kind, out["single"], "single"])
    hvdlite = torch.load(out["hvdlite"])
    _same(hvdlite, torch.load(out["gloo"]), exact=True)
    _same(hvdlite, torch.load(out["single"]), exact=False)


def test_lightning_strategy_hvdlite_trains_at_an_odd_size_as_one_process(tmp_path):
    # Trainer(strategy="hvdlite") with devices left alone, under plain hvdliterun: hvdlite starts
    # itself and gives each host's ranks their processes, as Horovod's strategy did.
    named, single = str(tmp_path / "named.pt"), str(tmp_path / "single.pt")
    result = _hvdliterun(3, [LIGHTNING, "named", named], mode=False)
    for rank in range(3):
        assert f"lightning named ok backend hvdlite rank {rank}" in result.lines(rank), result.output
    _python([LIGHTNING, "trainer", single, "single"])
    _same(torch.load(named), torch.load(single), exact=False)
