"""The timeline through the real launcher: --timeline-filename, stop_timeline / start_timeline."""

import json

import pytest

from .harness import SCRIPTS, run_job

pytestmark = pytest.mark.multirank


def rows(trace):
    """tensor name -> its events in file order (metadata left out)."""
    ids = {e["args"]["name"]: e["tid"] for e in trace if e.get("name") == "thread_name"}
    return {name: [e for e in trace if e.get("tid") == tid and e["ph"] != "M"] for name, tid in ids.items()}


@pytest.mark.parametrize("np", [2, 3])
def test_timeline_records_each_tensor_from_submission_to_completion(tmp_path, np):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    result = run_job(["--timeline-filename", str(first), "python", str(SCRIPTS / "timeline.py"), str(second)],
                     np=np, timeout=60)
    assert result.returncode == 0 and result.lines(0) == ["done"], result.output
    recorded = rows(json.loads(first.read_text()))
    # Horovod's row names, <op>.<tensor name>; nothing after stop_timeline()
    assert set(recorded) == {"allreduce.first", "allreduce.pair.0", "allreduce.pair.1", "broadcast.bcast"}
    for name, events in recorded.items():
        spans = [(e["ph"], e.get("name")) for e in events if e["ph"] in "BE"]
        op = name.split(".")[0].upper()
        assert spans == [("B", f"NEGOTIATE_{op}"), ("E", None), ("B", op), ("E", None)], (name, spans)
    ready = [e["name"] for e in recorded["allreduce.first"] if e["ph"] == "i"]
    assert sorted(ready) == [f"rank {r} ready" for r in range(np)]  # rank 0 saw every rank become ready
    fused = [next(e for e in recorded[n] if e.get("name") == "ALLREDUCE")["args"]["fused_with"] for n in ("allreduce.pair.0", "allreduce.pair.1")]
    assert fused == [1, 1]
    restarted = json.loads(second.read_text())
    assert set(rows(restarted)) == {"allgather.second"} and any(e.get("name") == "CYCLE_START" for e in restarted)
