"""The CUDA stack: which NCCL wheel is loaded and what does not fit together (hvdlite.gpu.stack), as
pure logic over wheel names and versions, and what this machine has."""

import importlib.metadata

import pytest
from hvdlite.runner.check_build import report

from hvdlite.gpu import nccl, stack
from hvdlite.gpu.stack import Wheel

CUPY12, CUPY13 = Wheel("cupy-cuda12x", "14.2.0", 12), Wheel("cupy-cuda13x", "14.2.0", 13)
NCCL12, NCCL13 = Wheel("nvidia-nccl-cu12", "2.32.3", 12), Wheel("nvidia-nccl-cu13", "2.28.9", 13)


@pytest.mark.parametrize("name, cuda", [("cupy-cuda12x", 12), ("cupy-cuda13x", 13), ("nvidia-nccl-cu12", 12),
                                        ("nvidia-nccl-cu13", 13)])
def test_the_cuda_version_comes_from_the_wheels_name(name, cuda):
    assert stack.cuda_of(name) == cuda


def test_nccl_is_chosen_for_cupys_cuda_when_both_are_installed():
    assert stack.choose_nccl([NCCL13, NCCL12], [CUPY12]) == NCCL12
    assert stack.choose_nccl([NCCL13, NCCL12], [CUPY13]) == NCCL13
    assert stack.choose_nccl([NCCL12], [CUPY13]) == NCCL12  # the only one: loaded, and reported below
    assert stack.choose_nccl([NCCL13, NCCL12], []) == NCCL13
    assert stack.choose_nccl([], [CUPY12]) is None


def test_a_matching_stack_has_no_problem():
    assert stack.mismatches([CUPY13], [NCCL13], "13.0") == []
    assert stack.mismatches([CUPY12], [NCCL13, NCCL12], "12.8") == []
    assert stack.mismatches([CUPY12], [NCCL12], None) == []  # a CPU torch says nothing about CUDA


def test_what_does_not_fit_is_named_with_the_fix():
    (torch_problem,) = stack.mismatches([CUPY12], [NCCL12], "13.0")
    assert "cupy-cuda12x 14.2.0 (CUDA 12) beside torch built for CUDA 13.0: install hvdlite[gpu-cu13]" in torch_problem
    (nccl_problem,) = stack.mismatches([CUPY13], [NCCL12], "13.0")
    assert "NCCL comes from nvidia-nccl-cu12 2.32.3 (CUDA 12) but cupy from cupy-cuda13x" in nccl_problem
    assert "hvdlite[gpu-cu13]" in nccl_problem
    assert any("both cupy-cuda13x and cupy-cuda12x are installed" in p for p in stack.mismatches([CUPY13, CUPY12],
                                                                                               [NCCL13], None))


def test_this_machines_nccl_is_loaded_from_its_wheel_and_check_build_names_the_stack():
    wheels = stack.installed(stack.NCCL_WHEELS)
    if not wheels:
        pytest.skip("no NCCL wheel installed")
    chosen = stack.choose_nccl(wheels, stack.installed(stack.CUPY_WHEELS))
    files = importlib.metadata.distribution(chosen.name).files
    assert nccl.library_path() == str(importlib.metadata.distribution(chosen.name).locate_file(
        next(f for f in files if f.name == "libnccl.so.2")))
    text = report({})
    assert "CUDA stack:" in text and f"NCCL: {chosen}" in text, text
