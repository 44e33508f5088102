"""The run page's line for each too-long-run alert state (diagnostics.views.alert)."""

from __future__ import annotations

import pytest

from diagnostics import views
from diagnostics.runs import AlertState

HOST = "https://hooks.example.com"


def test_no_alert_asked_for_shows_nothing() -> None:
    assert views.alert_summary(None) is None


@pytest.mark.parametrize(
    ("state", "level", "text"),
    [
        (
            AlertState("armed", 3600.0, HOST),
            "info",
            f"Too-long-run alert after 1 h 00 min, to {HOST}.",
        ),
        (
            AlertState("sending", 3600.0, HOST, step=412, elapsed_s=3600.4),
            "info",
            f"Passed its alert at step 412, 1 h 00 min in: posting to {HOST}…",
        ),
        (
            AlertState("sent", 90.0, HOST, step=20, elapsed_s=90.2, http_status=200),
            "success",
            f"Too-long-run alert sent to {HOST} (HTTP 200) at step 20, 1 min 30 s in.",
        ),
        (
            AlertState("failed", 90.0, HOST, step=20, elapsed_s=90.2, reason="timed out after 5 s"),
            "warning",
            "Too-long-run alert failed at step 20, 1 min 30 s in: timed out after 5 s. "
            "The run itself was not affected.",
        ),
        (
            AlertState("not_configured", 90.0),
            "info",
            "Too-long-run alert after 1 min 30 s is not configured: "
            "PIPELINE_DOCTOR_ALERT_WEBHOOK is not set.",
        ),
        (
            AlertState("not_configured", 90.0, step=None, elapsed_s=91.0),
            "warning",
            "Passed its alert of 1 min 30 s at step unknown, 1 min 31 s in, but no alert was sent: "
            "PIPELINE_DOCTOR_ALERT_WEBHOOK is not set.",
        ),
    ],
)
def test_each_state_reads_as_one_line(state: AlertState, level: str, text: str) -> None:
    shown = views.alert_summary(state)
    assert (shown.level, shown.text) == (level, text)
