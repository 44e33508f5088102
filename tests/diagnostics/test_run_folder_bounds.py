"""A run folder is read under bounds, as an uploaded trace is: links out of the folder, a
device, a FIFO, a file of gigabytes, an endless line, millions of records or figures no
run can have are each one line or one warning, never unbounded memory or a silent zero.

Each case is built at test time in a folder RunWriter made.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from diagnostics import runs as runs_module
from diagnostics.runs import MAX_RUN_JSON_BYTES, RunFolder, RunFolderError, RunWriter
from tests.conftest import REPO_ROOT


def _run(tmp_path, steps: int = 3) -> RunWriter:
    writer = RunWriter.create(
        tmp_path, {"scenario": "healthy", "steps": steps}, {"torch": "x"}, total_steps=steps
    )
    for step in range(1, steps + 1):
        writer.append_step({"step": step, "loss": 1.0, "step_time_ms": 10.0 * step})
    return writer


def _replace_steps(writer: RunWriter, make) -> None:
    lines = writer.path / "steps.jsonl"
    lines.unlink()
    make(lines)


@pytest.mark.parametrize("target", ["/dev/zero", "/etc/passwd"])
def test_a_records_file_linked_out_of_the_folder_is_refused_in_one_line(tmp_path, target):
    """Before: /dev/zero was read as one endless line until the memory limit (12 s), and
    /etc/passwd gave 'steps: 0', every line skipped without a word."""
    writer = _run(tmp_path)
    _replace_steps(writer, lambda lines: lines.symlink_to(target))
    started = time.monotonic()
    with pytest.raises(RunFolderError, match="a link out of the run folder") as caught:
        RunFolder(writer.path).steps()
    assert time.monotonic() - started < 5  # refused before any read
    assert "\n" not in str(caught.value)
    proc = subprocess.run(
        [sys.executable, "-m", "diagnostics", "analyze", "--format", "text", str(writer.path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "a link out of the run folder" in proc.stderr


def test_a_link_to_a_file_inside_the_folder_is_read(tmp_path):
    writer = _run(tmp_path)
    kept = writer.path / "steps.kept.jsonl"
    (writer.path / "steps.jsonl").rename(kept)
    (writer.path / "steps.jsonl").symlink_to(kept.name)
    assert RunFolder(writer.path).steps()["step"].to_list() == [1, 2, 3]


def test_a_records_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    writer = _run(tmp_path)
    _replace_steps(writer, os.mkfifo)
    with pytest.raises(RunFolderError, match="not a regular file"):
        RunFolder(writer.path).steps()
    assert RunFolder(writer.path).last_step() is None


def test_a_status_file_past_the_size_bound_is_refused_unread(tmp_path):
    """Before: a 1 GB status.json was read whole (3.2 GB of memory), in the app's process
    for every run it listed."""
    writer = _run(tmp_path)
    status = writer.path / "status.json"
    document = json.loads(status.read_text())
    document["reason"] = "x" * MAX_RUN_JSON_BYTES
    status.write_text(json.dumps(document))
    with pytest.raises(RunFolderError, match="larger than the 16 MiB a run file may be"):
        RunFolder(writer.path).status()


def test_an_over_long_line_is_skipped_in_pieces_and_said(tmp_path):
    writer = _run(tmp_path)
    with (writer.path / "steps.jsonl").open("a") as handle:
        handle.write('{"step": 4, "note": "' + "y" * (3 << 20) + '"}\n')
        handle.write('{"step": 5, "loss": 1.0, "step_time_ms": 50.0}\n')
    run = RunFolder(writer.path)
    assert run.steps()["step"].to_list() == [1, 2, 3, 5]
    (warning,) = run.record_warnings()
    assert "left out 1 line(s) that are not a JSON record" in warning


def test_lines_that_are_no_records_are_said_not_silently_zero(tmp_path):
    writer = _run(tmp_path)
    _replace_steps(
        writer, lambda lines: lines.write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1\n")
    )
    run = RunFolder(writer.path)
    assert run.steps().height == 0
    assert "left out 2 line(s) that are not a JSON record" in run.record_warnings()[0]


def test_durations_no_run_can_have_are_left_out_with_a_warning(tmp_path):
    """Before: a step_time_ms of 1e300 was printed as a 300-digit mean."""
    writer = _run(tmp_path)
    writer.append_step({"step": 4, "loss": 1.0, "step_time_ms": 1e300})
    writer.append_step({"step": 5, "loss": 1.0, "step_time_ms": 20.0, "data_wait_ms": -3.0})
    run = RunFolder(writer.path)
    steps = run.steps()
    assert steps["step"].to_list() == [1, 2, 3]
    assert steps["step_time_ms"].max() == 30.0
    (warning,) = run.record_warnings()
    assert "out of range" in warning and "step_time_ms (1)" in warning
    assert "data_wait_ms (1)" in warning


def test_more_records_than_the_bound_is_one_line(tmp_path, monkeypatch):
    """Before: a 10 M-line steps.jsonl hit the memory limit instead of a line."""
    monkeypatch.setattr(runs_module, "MAX_RUN_RECORDS", 50)
    writer = _run(tmp_path, steps=51)
    with pytest.raises(RunFolderError, match="more than 50 records: not read"):
        RunFolder(writer.path).steps()
