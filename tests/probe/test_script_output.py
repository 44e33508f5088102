"""A profiled script's output and its run's name, whatever the script is called or prints.

Scripts written here at test time; real subprocesses of ``python -m probe profile``.
"""

from __future__ import annotations

from probe.cli import LOG_KEEP_BYTES
from tests.probe.helpers import profile, run_folder


def test_output_without_newlines_passes_through_whole_and_the_log_is_capped(tmp_path):
    """Before: the wrapper held a line until its newline (3.17 GB of memory for 1.5 GB of
    output, a MemoryError in the copying thread past 2.2 GB) and the log kept every byte."""
    total = 3 * LOG_KEEP_BYTES  # 12 MiB, no newline until the last line
    script = tmp_path / "flood.py"
    script.write_text(
        "import sys\n"
        f"for i in range({total // 4096}):\n"
        "    sys.stdout.write(str(i % 10) * 4096)\n"
        "sys.stdout.write('\\nend of output\\n')\n"
    )
    result = profile(tmp_path / "runs", "--no-trace", str(script))
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert len(lines[0]) == total and lines[1] == "end of output"  # passed through whole
    log = (run_folder(result) / "log.txt").read_bytes()
    assert len(log) < 2 * LOG_KEEP_BYTES + 4096
    cut = total + len("\nend of output\n") - 2 * LOG_KEEP_BYTES
    assert f"[pipeline-doctor: {cut:,} bytes of output left out here".encode() in log
    assert log.endswith(b"end of output\n")
    assert b"0" * 4096 + b"1" * 4096 in log  # the head, as it came


def test_a_script_name_with_a_newline_gives_a_run_id_of_safe_characters(tmp_path):
    """Before: the newline went into the run id, so the last line printed was not the
    folder."""
    script = tmp_path / "my\ntrain\u202e.py"
    script.write_text("print('trained')\n")
    result = profile(tmp_path / "runs", "--no-trace", str(script))
    assert result.returncode == 0, result.stderr[-2000:]
    folder = run_folder(result)
    assert folder.is_dir() and folder.parent == tmp_path / "runs"
    assert "-script-my-train-" in folder.name


def test_a_run_id_that_is_no_plain_folder_name_is_refused(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    for run_id in ("../outside", "a\nb", ".hidden"):
        result = profile(tmp_path / "runs", "--run-id", run_id, str(script))
        assert result.returncode == 2
        assert result.stderr.startswith("error: --run-id: ") and result.stderr.count("\n") == 1
    assert not (tmp_path / "outside").exists()
