"""The elastic examples (examples/elastic/) run as their docstrings say: elastic jobs through hvdliterun
with --min-np 2, and with the example discovery script, every rank printing its done line."""

import re
from pathlib import Path

import pytest

from .harness import run_job

pytestmark = pytest.mark.multirank
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "elastic"
SMALL_ARGS = {
    "torch_elastic.py": ["--epochs", "2", "--train-size", "1024", "--batches-per-commit", "4"],
    "keras_elastic.py": ["--epochs", "2", "--train-size", "1024", "--batches-per-commit", "4"],
    "jax_elastic.py": ["--steps", "40", "--steps-per-commit", "4"],
}


def _assert_every_rank_done(result, np: int) -> None:
    assert result.returncode == 0, f"exit code {result.returncode}; output:\n{result.output}"
    for rank in range(np):
        done = [line for line in result.lines(rank) if re.fullmatch(rf"rank {rank} of {np}: done, loss \d+\.\d+", line)]
        assert len(done) == 1, f"rank {rank} did not print its done line; output:\n{result.output}"
    losses = {line.rsplit(" ", 1)[1] for rank in range(np) for line in result.lines(rank) if ": done, loss " in line}
    assert len(losses) == 1, f"ranks ended with different weights: {losses}\n{result.output}"


@pytest.mark.parametrize("np, example", [(3, "torch_elastic.py"), (2, "torch_elastic.py"),
                                         (3, "keras_elastic.py"), (3, "jax_elastic.py")])
def test_example_finishes_on_every_rank(example, np):
    result = run_job(["--min-np", "2", "python", str(EXAMPLES / example), *SMALL_ARGS[example]], np=np, timeout=240)
    _assert_every_rank_done(result, np)


def test_discovery_script_example_starts_the_job_on_the_hosts_it_prints(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:3\n")
    script = str(EXAMPLES / "hosts.sh")
    result = run_job(["--min-np", "2", "--max-np", "3", "--host-discovery-script", script, "python",
                      str(EXAMPLES / "torch_elastic.py"), *SMALL_ARGS["torch_elastic.py"]],
                     env={"HOSTS_FILE": str(hosts)}, timeout=240)
    _assert_every_rank_done(result, 3)
