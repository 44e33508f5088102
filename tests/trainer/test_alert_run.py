"""runtime.alert_after_s in a real trainer run, against a webhook on 127.0.0.1 that hangs.

The alert fires at once (a threshold of 10 ms) and its post hangs for longer than the
post's 5 s timeout; the run must train on while it hangs, finish ``completed``, and record
the timeout. One tiny run (tests/conftest.py TINY_RUN_ARGS) serves every assertion. The
webhook's other answers (200, 500, refused) are tested without a trainer in
tests/probe/test_alert.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from diagnostics.runs import RunFolder
from probe.alert import ALERT_TIMEOUT_S, ALERT_WEBHOOK_ENV
from tests.alert_webhook import Webhook
from tests.conftest import REPO_ROOT, TINY_RUN_ARGS

# one real run: 13 s on an idle 2-core host, 27 s on a loaded one
pytestmark = pytest.mark.slow

# TINY_RUN_ARGS: 2 masked-LM steps + 8 fine-tuning steps
TOTAL_STEPS = 10


class HungRun:
    def __init__(self, run_dir: Path, hook: Webhook, stderr: str):
        self.run_dir = run_dir
        self.hook = hook
        self.stderr = stderr


@pytest.fixture(scope="module")
def hung_run(tmp_path_factory: pytest.TempPathFactory) -> HungRun:
    runs_dir = tmp_path_factory.mktemp("alert_runs")
    with Webhook("hang") as hook:
        hook.hang_s = 30.0  # far past the post's timeout: only the timeout can end it
        env = {**os.environ, ALERT_WEBHOOK_ENV: hook.url}
        result = subprocess.run(
            [sys.executable, "-m", "trainer", "run", *TINY_RUN_ARGS]
            + ["--set", "runtime.alert_after_s=0.01", "--runs-dir", str(runs_dir)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert result.returncode == 0, result.stderr[-3000:]
    return HungRun(Path(result.stdout.strip().splitlines()[-1]), hook, result.stderr)


def test_the_run_finishes_while_the_webhook_hangs(hung_run: HungRun) -> None:
    run = RunFolder(hung_run.run_dir)
    assert run.status().status == "completed"
    assert run.last_step() == TOTAL_STEPS
    assert len(hung_run.hook.bodies) == 1  # posted once, never retried


def test_steps_were_trained_while_the_post_hung(hung_run: HungRun) -> None:
    posted_at = hung_run.hook.received_at[0]
    wall = RunFolder(hung_run.run_dir).steps()["wall_time"].to_list()
    during = [t for t in wall if posted_at < t < posted_at + ALERT_TIMEOUT_S]
    assert during, f"no step between the post ({posted_at}) and its timeout: {wall}"


def test_the_state_says_it_timed_out(hung_run: HungRun) -> None:
    state = RunFolder(hung_run.run_dir).alert()
    assert state.state == "failed"
    assert state.reason == f"timed out after {ALERT_TIMEOUT_S:g} s"
    assert state.threshold_s == 0.01 and state.passed
    assert state.webhook == f"http://127.0.0.1:{hung_run.hook.server.server_port}"


def test_the_body_names_the_run_and_its_host(hung_run: HungRun) -> None:
    text = hung_run.hook.bodies[0]["json"]["text"]
    assert hung_run.run_dir.name in text and os.uname().nodename in text
    assert f"of {TOTAL_STEPS}" in text and "past its alert of 0.01 s" in text


def test_the_run_page_shows_the_alert_state(hung_run: HungRun, monkeypatch) -> None:
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(hung_run.run_dir.parent))
    at = AppTest.from_file(str(REPO_ROOT / "app.py"), default_timeout=120)
    at.query_params["run"] = hung_run.run_dir.name
    at.switch_page("pages/3_Run_detail.py")
    at.run()
    assert not at.exception, at.exception
    warnings = [str(w.value) for w in at.warning]
    step = RunFolder(hung_run.run_dir).alert().step
    assert any(
        w.startswith(f"Too-long-run alert failed at step {step}, ")
        and w.endswith(": timed out after 5 s. The run itself was not affected.")
        for w in warnings
    ), warnings
