"""The launcher's fixed cost: what it imports before the script's process starts.

Structure, not timing: ``pipeline-doctor profile`` is two interpreters, and what the
launcher imports before it starts the child delays the script's first line. polars (the
run folder's frames, 0.5-1 s to import) is needed only for the parquet copies at the end,
and torch only in the child.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.probe.helpers import child_env

# Runs the real launcher with Popen replaced by a recorder: at the moment the child would
# start, which heavy modules the launcher holds; then a child that does nothing, so the
# test costs no torch import (the run ends "failed": that child writes no end of its own).
LAUNCH = """
import json, subprocess, sys
from pathlib import Path
seen = {}
real_popen = subprocess.Popen

def recording_popen(command, *args, **kwargs):
    seen.update(
        {name: name in sys.modules for name in ("polars", "torch", "numpy")},
        child=command[1:3],
    )
    return real_popen([sys.executable, "-c", "pass"], *args, **kwargs)

subprocess.Popen = recording_popen
from probe.cli import main

code = main(["profile", "--runs-dir", sys.argv[1], "--run-id", "r", sys.argv[2]])
seen["exit_code"] = code
seen["status"] = json.loads((Path(sys.argv[1]) / "r" / "status.json").read_text())["status"]
print("SEEN " + json.dumps(seen))
"""


def test_the_launcher_starts_the_script_process_before_importing_polars_or_torch(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('never run: the recorder replaces the child')\n")
    done = subprocess.run(
        [sys.executable, "-c", LAUNCH, str(tmp_path / "runs"), str(script)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("SEEN ")]
    assert lines, done.stderr[-2000:]
    seen = json.loads(lines[-1].removeprefix("SEEN "))
    assert seen["child"] == ["-m", "probe.child"]
    assert (seen["polars"], seen["torch"], seen["numpy"]) == (False, False, False)
    # the end still writes the run's status (and its parquet copies need polars by then)
    assert (seen["exit_code"], seen["status"]) == (1, "failed")
    assert (tmp_path / "runs" / "r" / "steps.parquet").is_file()


def test_importing_the_launcher_or_the_run_folder_module_leaves_polars_unloaded():
    check = (
        "import sys, probe.cli, diagnostics.runs; "
        "print(sorted(m for m in ('polars', 'torch') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], env=child_env(), capture_output=True, text=True
    )
    assert done.stdout.strip() == "[]", done.stderr[-2000:]
