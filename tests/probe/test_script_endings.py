"""However a profiled script ends, the run ends as ``python train.py`` would have: the same
exit code (128 + N for signal N), its own traceback or ``sys.excepthook``, and every step
it trained kept. Each script is written here, at test time; each run is a real subprocess
of ``python -m probe profile``.
"""

from __future__ import annotations

import textwrap

from diagnostics.runs import RunFolder
from tests.probe.helpers import line_of, profile, run_folder

_LOOP = """\
import os, signal, sys, time
import torch
torch.set_num_threads(1)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
def train(steps):
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
"""


def _profile(tmp_path, body: str, *options: str):
    script = tmp_path / "train.py"
    script.write_text(_LOOP + textwrap.dedent(body))
    result = profile(tmp_path / "runs", "--no-trace", *options, str(script))
    folder = sorted((tmp_path / "runs").iterdir())
    assert len(folder) == 1, result.stderr[-2000:]
    return result, RunFolder(folder[0]), script


def test_os_exit_0_after_training_is_completed_with_every_step(tmp_path):
    """Before: failed, "exit code 0 (no end recorded by rank 0)", exit 1, 10 of 25 steps."""
    result, run, _ = _profile(tmp_path, "train(25)\nos._exit(0)\n")
    assert result.returncode == 0, result.stderr[-2000:]
    assert run_folder(result) == run.path
    assert (run.status().status, run.status().step) == ("completed", 25)
    assert run.steps().height == 25


def test_os_exit_with_a_code_fails_with_it(tmp_path):
    result, run, _ = _profile(tmp_path, "train(7)\nos._exit(3)\n")
    assert result.returncode == 3
    status = run.status()
    assert (status.status, status.reason) == ("failed", "exit code 3 (os._exit)")
    assert run.steps().height == 7


def test_a_script_killed_by_a_signal_exits_128_plus_it_and_keeps_its_steps(tmp_path):
    """Before: exit 247 (the child's -9 passed through), 11 of 25 steps kept."""
    body = "train(25)\ntime.sleep(2.0)\nos.kill(os.getpid(), signal.SIGKILL)\n"
    result, run, _ = _profile(tmp_path, body)
    assert result.returncode == 128 + 9
    assert "killed by SIGKILL" in run.status().reason
    # the steps waiting for their batch read were written while the script slept
    assert run.steps()["step"].to_list() == list(range(1, 26))


def test_a_segmentation_fault_exits_139(tmp_path):
    result, run, _ = _profile(tmp_path, "train(3)\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    assert result.returncode == 128 + 11
    assert run.status().status == "failed" and "SIGSEGV" in run.status().reason


def test_a_keyboard_interrupt_the_script_raises_is_its_error_not_a_cancel(tmp_path):
    """Before: "cancelled, interrupted (SIGINT)" with no traceback, though no signal came."""
    result, run, script = _profile(tmp_path, "train(5)\nraise KeyboardInterrupt\n")
    assert result.returncode == 130  # as python train.py ends
    assert (run.status().status, run.status().reason) == ("failed", "KeyboardInterrupt")
    line = line_of(script, "raise KeyboardInterrupt")
    assert f'File "{script}", line {line}, in <module>' in result.stderr
    assert result.stderr.rstrip().endswith("KeyboardInterrupt")
    assert "probe/child.py" not in result.stderr


def test_the_scripts_own_excepthook_reports_its_error(tmp_path):
    """Before: the hook was never called; the wrapper printed its own traceback."""
    body = """\
    def report(kind, value, tb):
        print(f"reported by the script: {kind.__name__}: {value} at line {tb.tb_lineno}",
              file=sys.stderr)
    sys.excepthook = report
    train(2)
    raise ValueError("bad batch")
    """
    result, run, script = _profile(tmp_path, body)
    assert result.returncode == 1
    line = line_of(script, 'raise ValueError("bad batch")')
    assert f"reported by the script: ValueError: bad batch at line {line}" in result.stderr
    assert "Traceback" not in result.stderr
    assert run.status().reason == "ValueError: bad batch"


def test_a_file_python_cannot_compile_shows_only_its_error(tmp_path):
    """Before: a traceback through the wrapper's frames (probe/child.py, <frozen runpy>)."""
    script = tmp_path / "train.py"
    script.write_bytes(b"import torch\nx = 1\x00\n")
    result = profile(tmp_path / "runs", "--no-trace", str(script))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "SyntaxError: source code string cannot contain null bytes"
    )
    assert "probe/child.py" not in result.stderr and "runpy" not in result.stderr


def test_the_step_limit_holds_when_the_script_catches_every_exception(tmp_path):
    """Before: --steps 5 recorded 30 steps, completed, with no note."""
    body = """\
    for _ in range(30):
        try:
            train(1)
        except BaseException as caught:
            print("caught", type(caught).__name__, flush=True)
    print("the loop ran to its end", flush=True)
    """
    result, run, _ = _profile(tmp_path, body, "--steps", "5")
    assert result.returncode == 0
    assert "caught StepLimitReached" in result.stdout
    assert "the loop ran to its end" not in result.stdout
    assert (run.status().status, run.status().step) == ("completed", 5)
    assert run.steps().height == 5
    assert any("caught the --steps stop" in note for note in run.manifest().notes)
