"""The run folder: written by RunWriter, read by RunFolder, robust to crashes."""

from __future__ import annotations

import json
import time

import pytest

from diagnostics.runs import (
    HEARTBEAT_STALE_AFTER_S,
    RunFolder,
    RunFolderError,
    RunWriter,
    list_runs,
)


def _writer(tmp_path, **kwargs):
    return RunWriter.create(
        tmp_path, {"scenario": "healthy", "steps": 3}, {"torch": "x"}, total_steps=3, **kwargs
    )


def test_written_run_reads_back_typed(tmp_path):
    writer = _writer(tmp_path)
    for step in (1, 2, 3):
        writer.append_step({"step": step, "loss": 1.0 / step, "wall_time": time.time()})
    writer.append_sample({"wall_time": time.time(), "cpu_percent": 50.0, "gpu_index": None})
    writer.finalise("completed")

    run = RunFolder(writer.path)
    assert run.manifest().scenario == "healthy"
    assert run.status().status == "completed"
    steps = run.steps()
    assert steps["step"].to_list() == [1, 2, 3]
    assert steps["loss"].to_list() == [1.0, 0.5, 1.0 / 3]
    # absent fields come back as typed null columns, not missing columns
    assert steps["grad_norm"].null_count() == 3
    assert (writer.path / "steps.parquet").exists()
    assert run.samples()["cpu_percent"].to_list() == [50.0]


def test_torn_last_line_is_skipped(tmp_path):
    writer = _writer(tmp_path)
    writer.append_step({"step": 1, "loss": 2.0})
    # a SIGKILL mid-write leaves half a record behind
    with (writer.path / "steps.jsonl").open("a") as handle:
        handle.write('{"step": 2, "lo')
    assert RunFolder(writer.path).steps()["step"].to_list() == [1]


def test_running_run_without_heartbeat_is_dead(tmp_path):
    writer = _writer(tmp_path)
    run = RunFolder(writer.path)
    assert run.status().status == "running"
    later = time.time() + HEARTBEAT_STALE_AFTER_S + 1
    dead = run.status(now=later)
    assert dead.status == "dead"
    assert "no heartbeat" in dead.reason


def test_reopen_resumes_appending_and_drops_stale_parquet(tmp_path):
    writer = _writer(tmp_path)
    writer.append_step({"step": 1})
    writer.finalise("preempted", "SIGTERM")
    resumed = RunWriter.reopen(writer.path)
    assert not (writer.path / "steps.parquet").exists()
    resumed.append_step({"step": 2})
    resumed.finalise("completed")
    assert RunFolder(writer.path).steps()["step"].to_list() == [1, 2]
    assert RunFolder(writer.path).status().status == "completed"


def test_unknown_version_is_a_clear_error(tmp_path):
    writer = _writer(tmp_path)
    manifest = json.loads((writer.path / "run.json").read_text())
    manifest["version"] = 99
    (writer.path / "run.json").write_text(json.dumps(manifest))
    with pytest.raises(RunFolderError, match="version 99"):
        RunFolder(writer.path).manifest()


def test_list_runs_newest_first_and_reports_broken(tmp_path):
    first = _writer(tmp_path, run_id="a")
    first.finalise("completed")
    second = _writer(tmp_path, run_id="b")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run.json").write_text("{not json")
    listings = {r.run_id: r for r in list_runs(tmp_path)}
    assert set(listings) == {"a", "b", "broken"}
    assert listings["b"].status.status == "running"
    assert listings["broken"].error and "unreadable" in listings["broken"].error
    assert second.path.name == "b"


def test_manifest_keeps_fields_added_while_running(tmp_path):
    writer = _writer(tmp_path)
    writer.update_manifest(model_parameters=1234)
    manifest = RunFolder(writer.path).manifest()
    assert manifest.extra == {"model_parameters": 1234}
    assert manifest.scenario == "healthy"
