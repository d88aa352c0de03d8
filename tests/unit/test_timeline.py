"""The timeline file: valid JSON after every flush, events per tensor row, and the engine's events."""

import json

import numpy as np

from hvdlite.core.pipeline.timeline import Timeline

from .fake_ranks import start_engines, stop_engines
from .test_engine_in_process import submit


def events(path):
    with open(path) as handle:
        return json.load(handle)  # fails unless the file is a complete JSON array


def test_file_is_valid_json_after_every_flush_without_close(tmp_path):
    path = tmp_path / "t.json"
    timeline = Timeline(str(path), 0)
    assert [e["name"] for e in events(path)] == ["process_name"]
    timeline.begin("w", "NEGOTIATE_ALLREDUCE", 1.0 + timeline._start)
    timeline.flush()
    first = events(path)
    timeline.end("w", 2.5 + timeline._start)
    timeline.instant("w", "rank 1 ready", 2.0 + timeline._start)
    timeline.flush()
    second = events(path)  # a process killed here still leaves a readable file
    assert second[: len(first)] == first and len(second) == len(first) + 2
    row = next(e["tid"] for e in second if e.get("args", {}).get("name") == "w")
    begin, end = [e for e in second if e.get("tid") == row and e["ph"] in "BE"]
    assert (begin["ts"], end["ts"]) == (1e6, 2.5e6)
    timeline.close()
    timeline.close()
    assert events(path) == second


def test_engine_records_negotiation_readiness_and_fusion(tmp_path):
    path = tmp_path / "engine.json"
    _, engines = start_engines(2)
    try:
        engines[0].use_timeline(Timeline(str(path), 0))
        handles = [submit(e, f"small.{i}", np.ones(4)) for e in engines for i in range(2)]
        handles += [submit(e, "big", np.ones(20000)) for e in engines]
        for handle in handles:
            handle.wait(10)
        engines[0].timeline.close()
    finally:
        stop_engines(engines)
    trace = events(path)
    rows = {e["args"]["name"]: e["tid"] for e in trace if e.get("name") == "thread_name"}
    assert set(rows) == {"allreduce.small.0", "allreduce.small.1", "allreduce.big"}  # Horovod's <op>.<name>
    for name, row in rows.items():
        mine = [e for e in trace if e.get("tid") == row and e["ph"] != "M"]
        phases = [(e["ph"], e.get("name", "")) for e in mine]
        assert phases[0] == ("B", "NEGOTIATE_ALLREDUCE") and phases[-1][0] == "E", phases
        assert {p[1] for p in phases if p[0] == "i"} == {"rank 0 ready", "rank 1 ready"}, phases
        op = next(e for e in mine if e["ph"] == "B" and e["name"] == "ALLREDUCE")
        assert op["args"]["fused_with"] == (0 if name == "allreduce.big" else 1)
        spans = [e["ts"] for e in mine if e["ph"] in "BE"]  # negotiate begin/end, then execute begin/end
        assert len(spans) == 4 and spans == sorted(spans), phases
