"""The too-long-run alert (probe/alert.py) against a real HTTP server on 127.0.0.1.

The server is http.server in a thread: one webhook that answers 200 and keeps the bodies,
one that hangs (answers nothing for longer than the post's timeout), one that answers 500.
No trainer here: tests/trainer/test_alert_run.py runs the trainer with a hanging webhook.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from diagnostics.runs import RunFolder, RunFolderError, write_alert_state
from probe.alert import ALERT_WEBHOOK_ENV, AlertMoment, RunAlert, alert_text, webhook_host
from tests.alert_webhook import HANG_S, Webhook


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "healthy-20261201-000000"
    path.mkdir()
    return path


def _wait_for(run_dir: Path, states: set[str], within_s: float = 10.0):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        state = RunFolder(run_dir).alert()
        if state is not None and state.state in states:
            return state
        time.sleep(0.02)
    raise AssertionError(f"alert never reached {states}: {RunFolder(run_dir).alert()}")


def _alert(run_dir: Path, url: str | None, threshold_s: float = 0.1, **kw) -> RunAlert:
    environ = {ALERT_WEBHOOK_ENV: url} if url else {}
    return RunAlert(
        run_dir, threshold_s, step=lambda: 3, total_steps=lambda: 10, environ=environ, **kw
    )


def test_alert_text_names_run_step_elapsed_eta_and_host() -> None:
    moment = AlertMoment("healthy-1", "gpu-box", 20, 80, elapsed_s=100.0, threshold_s=90.0)
    # 100 s for 20 steps is 5 s a step; 60 steps left: 300 s
    assert moment.eta_s == pytest.approx(300.0)
    assert alert_text(moment) == (
        "Pipeline Doctor: run healthy-1 on gpu-box has run 100 s, past its alert of 90 s; "
        "step 20 of 80, ETA 300 s"
    )


@pytest.mark.parametrize(
    ("step", "total", "where"),
    [(0, 80, "step 0 of 80, ETA unknown"), (5, None, "step 5, ETA unknown")],
)
def test_eta_is_unknown_without_a_pace_or_an_end(step, total, where) -> None:
    moment = AlertMoment("r", "h", step, total, elapsed_s=10.0, threshold_s=5.0)
    assert moment.eta_s is None
    assert alert_text(moment).endswith(where)


def test_only_the_webhook_host_is_written_down() -> None:
    assert webhook_host("https://hooks.example.com/services/T0/B0/tok?x=1") == (
        "https://hooks.example.com"
    )
    assert webhook_host("http://127.0.0.1:8080/a/b") == "http://127.0.0.1:8080"


def test_a_good_webhook_gets_one_slack_body(run_dir: Path) -> None:
    with Webhook("ok") as hook:
        alert = _alert(run_dir, hook.url)
        alert.start()
        state = _wait_for(run_dir, {"sent", "failed"})
        alert.close()
    assert state.state == "sent" and state.http_status == 200
    assert len(hook.bodies) == 1
    body = hook.bodies[0]
    assert body["content_type"] == "application/json"
    assert list(body["json"]) == ["text"]  # Slack's incoming-webhook body
    text = body["json"]["text"]
    assert run_dir.name in text and socket.gethostname() in text
    assert "step 3 of 10" in text and "past its alert of 0.1 s" in text
    # 3 steps in ~0.1 s, 7 left: an ETA of a fraction of a second rounds to "0 s" or so
    assert "ETA " in text and "ETA unknown" not in text
    assert state.step == 3 and state.elapsed_s >= 0.1 and state.text == text
    assert state.webhook == f"http://127.0.0.1:{hook.server.server_port}"
    assert "secret-token" not in (run_dir / "alert.json").read_text()


def test_a_hanging_webhook_times_out_without_blocking_the_caller(run_dir: Path) -> None:
    with Webhook("hang") as hook:
        alert = _alert(run_dir, hook.url, timeout_s=0.5)
        began = time.monotonic()
        alert.start()
        assert time.monotonic() - began < 0.5  # start() only arms a timer
        assert _wait_for(run_dir, {"sending"}).passed
        state = _wait_for(run_dir, {"sent", "failed"}, within_s=HANG_S)
        alert.close()
    assert state.state == "failed"
    assert state.reason == "timed out after 0.5 s"
    assert len(hook.bodies) == 1


def test_a_500_is_recorded_as_failed(run_dir: Path) -> None:
    with Webhook("500") as hook:
        alert = _alert(run_dir, hook.url)
        alert.start()
        state = _wait_for(run_dir, {"sent", "failed"})
        alert.close()
    assert (state.state, state.reason) == ("failed", "the webhook answered HTTP 500")


def test_an_unreachable_webhook_is_recorded_as_failed(run_dir: Path) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    alert = _alert(run_dir, f"http://127.0.0.1:{port}/hook")
    alert.start()
    state = _wait_for(run_dir, {"sent", "failed"})
    alert.close()
    assert state.state == "failed" and state.reason.startswith("could not reach the webhook")


def test_no_webhook_is_not_configured_and_says_when_it_passed(run_dir: Path) -> None:
    alert = _alert(run_dir, None)
    alert.start()
    armed = RunFolder(run_dir).alert()
    assert armed.state == "not_configured" and not armed.passed
    time.sleep(0.3)
    alert.close()
    state = RunFolder(run_dir).alert()
    assert state.state == "not_configured" and state.passed and state.step == 3
    assert state.reason == f"{ALERT_WEBHOOK_ENV} is not set"


def test_a_run_ending_before_the_threshold_posts_nothing(run_dir: Path) -> None:
    with Webhook("ok") as hook:
        alert = _alert(run_dir, hook.url, threshold_s=30.0)
        alert.start()
        alert.close()
        time.sleep(0.1)
    assert hook.bodies == []
    assert RunFolder(run_dir).alert().state == "armed"


def test_a_resumed_run_does_not_alert_twice(run_dir: Path) -> None:
    with Webhook("ok") as hook:
        first = _alert(run_dir, hook.url)
        first.start()
        _wait_for(run_dir, {"sent"})
        first.close()
        second = _alert(run_dir, hook.url)  # the resumed process, already past it
        second.start()
        time.sleep(0.3)
        second.close()
    assert len(hook.bodies) == 1
    assert RunFolder(run_dir).alert().state == "sent"


def test_a_bad_alert_file_is_one_line_naming_it(run_dir: Path) -> None:
    write_alert_state(run_dir, {"state": "exploded", "threshold_s": 1.0})
    with pytest.raises(RunFolderError, match=r"alert\.json: unreadable \(state is 'exploded'\)"):
        RunFolder(run_dir).alert()


def test_no_alert_file_is_none(run_dir: Path) -> None:
    assert RunFolder(run_dir).alert() is None


@pytest.fixture(autouse=True)
def _no_stray_threads() -> Iterator[None]:
    yield
    for thread in threading.enumerate():
        if thread.name == "run-alert":
            thread.join(HANG_S + 1)
