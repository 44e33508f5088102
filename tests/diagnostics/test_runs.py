"""The run folder: written by RunWriter, read by RunFolder, robust to crashes."""

from __future__ import annotations

import json
import time
from pathlib import Path

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


def test_fields_given_at_create_are_in_the_first_manifest_a_reader_sees(tmp_path):
    # a script run's kind: the app lists a folder as soon as it exists, and a later update
    # left a moment (seen on a loaded host) in which the run read as the trainer's
    writer = RunWriter.create(
        tmp_path,
        {"scenario": None},
        {},
        run_id="script",
        extra={"kind": "script", "command": ["pipeline-doctor", "profile", "train.py"]},
    )
    manifest = RunFolder(writer.path).manifest()
    assert manifest.kind == "script"
    assert manifest.extra["command"] == ["pipeline-doctor", "profile", "train.py"]


# A malformed run file makes that one run "unreadable" (with the reason) and nothing else:
# the typed reader is the one place that decides, so `list`, every page and the analyser agree.
MALFORMED = [
    ("status.json", "[1, 2]", "a JSON list, not an object"),
    ("status.json", '{"status": "running", "step": "many"}', "step is 'many', not int"),
    ("status.json", '{"status": 7}', "status is 7"),
    ("status.json", '{"status": "completed", "heartbeat": "soon"}', "heartbeat is 'soon'"),
    ("status.json", "[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
    ("run.json", "[1, 2]", "a JSON list, not an object"),
    ("run.json", '{"version": 1, "config": [1]}', "config is [1], not dict"),
    ("run.json", '{"version": 1, "notes": "one"}', "notes is 'one', not list"),
    ("run.json", '{"version": 1, "created_at": "today"}', "created_at is 'today'"),
    ("run.json", "[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
]


@pytest.mark.parametrize(("name", "text", "reason"), MALFORMED)
def test_a_malformed_run_file_is_one_unreadable_run(tmp_path, name, text, reason):
    good = _writer(tmp_path, run_id="good")
    good.finalise("completed")
    bad = _writer(tmp_path, run_id="bad")
    bad.finalise("completed")
    (bad.path / name).write_text(text)
    with pytest.raises(RunFolderError, match=f"^{bad.path / name}: unreadable"):
        folder = RunFolder(bad.path)
        folder.manifest() if name == "run.json" else folder.status()
    listings = {run.run_id: run for run in list_runs(tmp_path)}
    assert listings["good"].status.status == "completed" and listings["good"].error is None
    assert listings["bad"].status.status == "unreadable"
    assert reason in listings["bad"].status.reason
    assert listings["bad"].error == listings["bad"].status.reason


def test_list_runs_of_a_folder_it_may_not_read_is_empty(tmp_path, monkeypatch):
    _writer(tmp_path).finalise("completed")
    assert len(list_runs(tmp_path)) == 1  # readable, the run is listed
    # Root reads any folder, so a real permission error cannot be made here: iterdir raises
    # the one the kernel would give a user without read permission on runs_dir.
    real_iterdir = Path.iterdir

    def iterdir_refused(self):
        if self == tmp_path:
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", iterdir_refused)
    assert list_runs(tmp_path) == []


def test_a_failed_status_write_leaves_no_tmp_file(tmp_path):
    writer = _writer(tmp_path)
    (writer.path / "status.json").unlink()
    (writer.path / "status.json").mkdir()  # os.replace onto a directory fails
    with pytest.raises(OSError):
        writer.heartbeat()
    assert not [p.name for p in writer.path.iterdir() if p.name.endswith(".tmp")]


def test_a_run_folder_that_cannot_be_completed_is_removed(tmp_path):
    looped: dict = {}
    looped["self"] = looped  # run.json cannot be written: the folder must not stay half-made
    with pytest.raises(ValueError, match="Circular reference"):
        RunWriter.create(tmp_path, {"scenario": "x", "bad": looped}, {}, run_id="half")
    assert not (tmp_path / "half").exists()


def test_the_same_run_id_twice_is_file_exists(tmp_path):
    _writer(tmp_path, run_id="taken")
    with pytest.raises(FileExistsError):
        _writer(tmp_path, run_id="taken")
