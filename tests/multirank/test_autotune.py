"""Autotune through the real launcher: every rank ends on rank 0's choice, and the log shows the search."""

import csv
import statistics

import pytest

from .harness import SCRIPTS, run_job

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("np", [2, 3])
def test_autotune_settles_on_the_logged_choice_on_every_rank(tmp_path, np):
    log = tmp_path / "autotune.csv"
    result = run_job(["--autotune", "--autotune-log-file", str(log), "python", str(SCRIPTS / "autotune.py")], np=np,
                     env={"HVDLITE_AUTOTUNE_SAMPLE_SECONDS": "0.1", "HVDLITE_AUTOTUNE_SAMPLES": "1"}, timeout=150)
    assert result.returncode == 0, result.output
    rows = list(csv.DictReader(log.read_text().splitlines()))
    phases = [row["phase"] for row in rows]
    assert phases[0] == "warmup" and phases[-1] == "chosen" and phases.count("sample") == 8 + 6, phases
    chosen = rows[-1]
    # The choice is the setting with the best median score (a setting measured in both phases has two).
    scores: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        if row["phase"] == "sample":
            scores.setdefault((row["fusion_threshold"], row["chunk_bytes"]), []).append(float(row["score_mb_per_s"]))
    best = max(scores, key=lambda key: statistics.median(scores[key]))
    assert (chosen["fusion_threshold"], chosen["chunk_bytes"]) == best
    expected = f"settled fusion_threshold={chosen['fusion_threshold']} chunk_bytes={chosen['chunk_bytes']}"
    for rank in range(np):
        (line,) = result.lines(rank)
        assert line.startswith(expected), (rank, line, chosen)
