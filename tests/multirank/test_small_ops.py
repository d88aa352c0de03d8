"""The small-op path with real ranks (np=2 and an odd size): results, process sets, join. Its other
guarantees are the regular path's and are tested through it where they are tested: a stall behind a
cached name and a rank that stops answering (test_failures: ``cached_stall``, ``silent``), a rank
that dies mid-call in an elastic job (test_elastic: ``elastic_shrink.py`` steps start with one)."""

import pytest

from .harness import run_script

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("np", [2, 3])
def test_small_allreduces_take_the_path_and_are_exact_on_the_job_and_a_set(np):
    result = run_script("small_ops.py", np, "steady", timeout=120)
    for rank in range(np):
        assert any(line.startswith("small ops ok") for line in result.lines(rank)), result.output


@pytest.mark.parametrize("np", [2, 3])
def test_joined_ranks_add_zeros_to_cached_names(np):
    result = run_script("small_ops.py", np, "join", timeout=120)
    for rank in range(np):
        assert f"join returned {np - 1}" in result.lines(rank), result.output
