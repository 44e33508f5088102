"""The script's process asks, at its end, whether its wrapper has gone (probe/wrapper_watch.py).

Real processes: this test's process stands for the wrapper, a child for the script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from probe.wrapper_watch import WRAPPER_PID_ENV, WrapperWatch, _pipe_without_reader
from tests.probe.helpers import child_env

_SCRIPTS_END = """
import json, sys, time
from pathlib import Path
from probe.wrapper_watch import WrapperWatch, _pipe_without_reader

wait_for_broken_pipe, settle_s, out = sys.argv[1] == "broken", float(sys.argv[2]), sys.argv[3]
while wait_for_broken_pipe and not _pipe_without_reader(1):
    time.sleep(0.01)
started = time.monotonic()
gone = WrapperWatch().wrapper_gone(settle_s=settle_s)
Path(out).write_text(json.dumps({"gone": gone, "waited_s": time.monotonic() - started}))
"""


def _scripts_end(tmp_path, *, close_its_stdout: bool, settle_s: float) -> dict:
    out = tmp_path / "end.json"
    mode = "broken" if close_its_stdout else "intact"
    script = subprocess.Popen(
        [sys.executable, "-c", _SCRIPTS_END, mode, str(settle_s), str(out)],
        env={**child_env(), WRAPPER_PID_ENV: str(os.getpid())},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        if close_its_stdout:
            script.stdout.close()
        _, stderr = script.communicate(timeout=120)
    finally:
        if script.poll() is None:
            script.kill()
    assert script.returncode == 0, stderr.decode()[-2000:]
    return json.loads(out.read_text())


def test_a_live_wrapper_whose_pipe_was_closed_is_waited_for_then_not_called_gone(tmp_path):
    end = _scripts_end(tmp_path, close_its_stdout=True, settle_s=0.5)
    assert end["gone"] is False  # it stayed: it writes the run's end itself
    assert end["waited_s"] >= 0.5


def test_a_live_wrapper_reading_the_scripts_output_is_not_waited_for(tmp_path):
    end = _scripts_end(tmp_path, close_its_stdout=False, settle_s=60.0)
    assert end["gone"] is False
    assert end["waited_s"] < 30.0  # no broken pipe: the settling is not waited out


def test_a_wrapper_that_is_no_ancestor_is_gone_and_no_wrapper_is_never_gone():
    # this process's own id: neither its parent nor its parent's parent
    assert WrapperWatch(environ={WRAPPER_PID_ENV: str(os.getpid())}).wrapper_gone(settle_s=0)
    assert not WrapperWatch(environ={}).wrapper_gone(settle_s=0)
    watch = WrapperWatch(environ={WRAPPER_PID_ENV: str(os.getppid())})
    assert not watch.wrapper_gone(settle_s=0)


def test_a_pipe_is_without_reader_only_once_every_reading_end_is_closed(tmp_path):
    read_end, write_end = os.pipe()
    try:
        assert not _pipe_without_reader(write_end)
        os.close(read_end)
        assert _pipe_without_reader(write_end)
    finally:
        os.close(write_end)
    with (tmp_path / "a file").open("w") as handle:
        assert not _pipe_without_reader(handle.fileno())
    assert not _pipe_without_reader(10_000)  # no such descriptor
