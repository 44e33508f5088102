"""An orphaned run's heartbeat, kept by rank 0 until the run's end (probe/wrapper_watch.py)."""

from __future__ import annotations

import json
import time

from diagnostics.runs import RunFolder, RunWriter
from probe.wrapper_watch import OrphanHeartbeat


def _status(folder) -> dict:
    return json.loads((folder / "status.json").read_text())


def _orphaned_run(tmp_path):
    writer = RunWriter.create(tmp_path / "runs", {"script": "train.py"}, {})
    writer.heartbeat()
    return writer.path


def test_it_beats_with_the_scripts_step_until_the_end_and_never_after(tmp_path):
    folder = _orphaned_run(tmp_path)
    steps = iter(range(1, 1000))
    keeper = OrphanHeartbeat(folder, lambda: next(steps), interval_s=0.05, bound_s=30.0)
    keeper.start()
    first = _status(folder)
    time.sleep(0.5)
    later = _status(folder)
    assert later["status"] == "running"
    assert later["heartbeat"] > first["heartbeat"]
    assert later["step"] > first["step"] >= 1
    keeper.end("failed", "the wrapper died", 7)
    ended = _status(folder)
    time.sleep(0.3)  # a beat after the end would turn it back to running
    assert _status(folder) == ended
    assert (ended["status"], ended["reason"], ended["step"]) == ("failed", "the wrapper died", 7)
    assert RunFolder(folder).status().status == "failed"


def test_it_stops_beating_after_its_bound_so_a_script_that_trains_on_reads_dead(tmp_path):
    folder = _orphaned_run(tmp_path)
    keeper = OrphanHeartbeat(folder, lambda: 3, interval_s=0.05, bound_s=0.3)
    keeper.start()
    time.sleep(0.8)
    settled = _status(folder)["heartbeat"]
    time.sleep(0.4)
    assert _status(folder)["heartbeat"] == settled
    assert RunFolder(folder).status(now=settled + 16.0).status == "dead"


def test_an_end_without_a_start_still_writes_the_runs_end(tmp_path):
    folder = _orphaned_run(tmp_path)
    OrphanHeartbeat(folder, lambda: 0).end("failed", "gone", 2)
    assert RunFolder(folder).status().status == "failed"
    OrphanHeartbeat(folder, lambda: 0)  # unstarted: writes nothing
    assert _status(folder)["step"] == 2
