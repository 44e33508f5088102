"""``pipeline-doctor profile --alert-after-s``: the own-job wrapper posts the same alert.

One real wrapped script (tests/scripts/manual_steps.py, five hand-marked steps) with a
threshold of 0.2 s: it passes while the script is still importing torch, so the step is
not known yet and the body says so. The webhook is http.server on 127.0.0.1.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from diagnostics.runs import RunFolder
from probe.alert import ALERT_WEBHOOK_ENV
from tests.alert_webhook import Webhook
from tests.probe.helpers import SCRIPTS, child_env, profile, profile_command, run_folder


def test_the_wrapper_posts_once_and_records_it(tmp_path: Path) -> None:
    runs_dir = tmp_path / "runs"
    with Webhook("ok") as hook:
        result = subprocess.run(
            profile_command(runs_dir, "--alert-after-s", "0.2", str(SCRIPTS / "manual_steps.py")),
            cwd=tmp_path,
            env={**child_env(), ALERT_WEBHOOK_ENV: hook.url},
            capture_output=True,
            text=True,
            timeout=240,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    run = RunFolder(run_folder(result))
    assert run.status().status == "completed" and run.last_step() == 5
    assert len(hook.bodies) == 1
    text = hook.bodies[0]["json"]["text"]
    assert run.run_id in text and "past its alert of 0.2 s" in text
    state = run.alert()
    assert (state.state, state.http_status, state.text) == ("sent", 200, text)
    assert run.manifest().config["alert_after_s"] == 0.2


def test_a_bad_threshold_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = profile(tmp_path / "runs", "--alert-after-s", "0", str(SCRIPTS / "manual_steps.py"))
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --alert-after-s: 0.0 is not a positive number"
    assert not (tmp_path / "runs").exists()
