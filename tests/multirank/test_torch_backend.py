"""torch.distributed's "hvdlite" backend with real ranks (np=2 and 3; a 2x2 mesh at np=4): every
collective torch calls, DDP, torch's FSDP2 with DCP, a device mesh, and failures, each against gloo
in the same job (tests/multirank/scripts/torch_backend.py says what each case checks); and
examples/torch_fsdp2.py (pytorch/examples' FSDP2 recipe) against one process, resumed at another size."""

import re
import shlex
from pathlib import Path

import pytest

from .harness import run_script, shared_jobs_in_order, shared_script

pytestmark = pytest.mark.multirank


def _every_rank_says(result, np, line):
    for rank in range(np):
        assert line in result.lines(rank), result.output


@pytest.mark.quick
@pytest.mark.parametrize("np", [2, 3])
def test_every_collective_equals_gloo(np):
    _every_rank_says(run_script("torch_backend.py", np, "collectives", timeout=180), np, "collectives ok")


@pytest.mark.parametrize(("np", "seed"), [(2, 1), (3, 0)])
def test_every_call_conforms_to_gloo(np, seed):
    """scripts/torch_conformance.py: each call of torch.distributed (every form, dtype, op, group
    shape, point-to-point, objects, futures, errors) on hvdlite and on gloo, in one job, compared."""
    result = run_script("torch_conformance.py", np, str(seed), timeout=240, expect_ok=False)
    mismatches = [line for line in result.output.splitlines() if "MISMATCH" in line]
    assert not mismatches, "\n".join(mismatches) + "\n" + result.output[-3000:]
    assert result.returncode == 0, result.output
    for rank in range(np):
        assert any(re.fullmatch(r"conformance: \d{3,} checks, 0 mismatches", line) for line in result.lines(rank)), \
            result.output


def _together(np: int):
    """One job per size for the training and error cases (together.py): torch starts once per rank."""
    return shared_script("together.py", np, *(f"torch_backend.py {case}" for case in ("training", "mismatch", "ddp_error")),
                         timeout=300)


@pytest.mark.parametrize("np", [2, 3])
def test_ddp_and_fsdp2_with_dcp_train_as_on_gloo(np):
    _every_rank_says(_together(np), np, "training ok")


def test_two_dimensional_mesh_hybrid_sharding_as_on_gloo():
    _every_rank_says(run_script("torch_backend.py", 4, "mesh", timeout=240), 4, "mesh ok")


@pytest.mark.parametrize("np", [2, 3])
def test_shape_mismatch_is_an_error_naming_each_rank_first_call_or_cached(np):
    result = _together(np)
    for rank in range(np):
        seconds = {}
        for line in result.lines(rank):
            if found := re.fullmatch(r"mismatch named after ([\d.]+) s \(cached: (\w+)\)", line):
                seconds[found.group(2)] = float(found.group(1))
        assert set(seconds) == {"False", "True"}, result.output
        # A cached call's divergence shows once a rank waited 5 s (CALL_DIVERGENCE_SECONDS); a generous bound
        assert seconds["True"] < 40, result.output


@pytest.mark.parametrize("np", [2, 3])
def test_error_in_a_ddp_step_is_raised_on_every_rank(np):
    _every_rank_says(_together(np), np, "ddp error named")


def test_killed_rank_under_ddp_ends_the_job_and_is_named():
    result = run_script("torch_backend.py", 3, "killed", timeout=120, expect_ok=False)
    assert result.returncode != 0
    assert re.search(r"hvdliterun: (rank 1 \(pid \d+\) was the first rank to end|ranks \[[\d, ]+\] ended before|"
                     r"MPI reports rank \d)", result.output), result.output
    assert result.seconds < 60, result.output


def test_uncaught_error_under_torch_excepthook_prints_its_traceback():
    result = run_script("torch_backend.py", 2, "uncaught", timeout=120, expect_ok=False)
    assert result.returncode != 0
    lines = result.lines(1)
    assert "RuntimeError: boom from a DDP training loop" in lines, result.output
    assert "hvdlite: rank 1 failed with an uncaught RuntimeError; aborting all ranks" in lines, result.output


EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "torch_fsdp2.py")
SHARDING = {"torch": [], "hvdlite": ["--hvdlite-fully-shard"]}  # whose fully_shard the example imports
# (api, first size, resumed size, whose fully_shard first, whose resumed)
PAIRS = [("--dcp-api", 2, 3, "torch", "hvdlite"), ("--dtensor-api", 3, 2, "hvdlite", "torch"),
         ("--dcp-api", 3, 2, "hvdlite", "hvdlite"), ("--dtensor-api", 2, 3, "torch", "torch")]


def _example(checkpoints: Path, *flags: str) -> str:
    return shlex.join([EXAMPLE, "--steps", "3", "--checkpoint-dir", str(checkpoints), *flags])


def _pair(root: Path, pair: tuple) -> tuple[str, str]:
    """The example's two runs of one pair: the first trains and saves, the second resumes."""
    api, _, _, first_sharding, then_sharding = pair
    flags = ["--check", "--explicit-prefetching"] + ([api] if api == "--dcp-api" else [])
    folder = root / "_".join(map(str, pair)).strip("-")
    return _example(folder, *flags, *SHARDING[first_sharding]), _example(folder, *flags, *SHARDING[then_sharding])


def _mixed_precision(root: Path, sharding: str) -> str:
    return _example(root / f"mixed-{sharding}", "--mixed-precision", *SHARDING[sharding])


def _example_jobs(root: Path) -> list[tuple[int, list[str]]]:
    """Every run of the example in three shared jobs (together.py: torch starts once per rank), in
    the order they run: at np=2 the first runs of the pairs that start at 2 and the mixed-precision
    runs; at np=3 the resumed runs of those pairs and the first runs of the others; at np=2 theirs."""
    runs = {pair: _pair(root, pair) for pair in PAIRS}
    return [(2, [runs[p][0] for p in PAIRS if p[1] == 2] + [_mixed_precision(root, s) for s in sorted(SHARDING)]),
            (3, [runs[p][1] for p in PAIRS if p[2] == 3] + [runs[p][0] for p in PAIRS if p[1] == 3]),
            (2, [runs[p][1] for p in PAIRS if p[2] == 2])]


def _example_run(root: Path, job: int, command: str) -> tuple[list[str], str]:
    """Rank 0's lines of one run of the example in the shared job ``job`` (0, 1 or 2; a pair's two runs
    can be the same command line), and that job's whole output; the jobs before it run first."""
    jobs = _example_jobs(root)
    assert command in jobs[job][1], f"job {job} does not run {command}"
    result = shared_jobs_in_order(jobs, job)
    return result.command_lines(0, command), result.output


@pytest.fixture(scope="session")
def example_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fsdp2_example")


@pytest.mark.parametrize(("api", "first", "then", "first_sharding", "then_sharding"), PAIRS)
def test_fsdp2_example_trains_saves_and_resumes_at_another_size_as_one_process(example_root, api, first, then,
                                                                                first_sharding, then_sharding):
    """pytorch/examples' FSDP2 recipe, on torch's fully_shard or (only the imports changed) hvdlite's,
    resumed from the other's checkpoint at another number of ranks."""
    saving, resuming = _pair(example_root, (api, first, then, first_sharding, then_sharding))
    saved, output = _example_run(example_root, 0 if first == 2 else 1, saving)
    assert any(line.startswith(f"equal to one process after 3 steps (ranks per step {[first] * 3})")
               for line in saved), output
    resumed, output = _example_run(example_root, 1 if then == 3 else 2, resuming)
    assert any(line.startswith(f"equal to one process after 6 steps (ranks per step {[first] * 3 + [then] * 3})")
               for line in resumed), output


@pytest.mark.parametrize("sharding", sorted(SHARDING))
def test_fsdp2_example_mixed_precision_gathers_bf16(example_root, sharding):
    # (the example's inspect_model asserts the root's parameters are full and bf16 after model.unshard())
    lines, output = _example_run(example_root, 0, _mixed_precision(example_root, sharding))
    assert "trained to step 3; checkpoint in" in " ".join(lines), output
