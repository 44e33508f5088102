"""The too-long-run alert as the run's page shows it: one line, its level and icon."""

from __future__ import annotations

from dataclasses import dataclass

from diagnostics.runs import AlertState
from diagnostics.views.fmt import fmt_seconds

WEBHOOK_ENV = "PIPELINE_DOCTOR_ALERT_WEBHOOK"  # probe.alert.ALERT_WEBHOOK_ENV


@dataclass(frozen=True)
class AlertView:
    level: str  # info | success | warning | error: the st.* call a page makes
    icon: str
    text: str


def _when(state: AlertState) -> str:
    step = "step unknown" if state.step is None else f"step {state.step}"
    return f"at {step}, {fmt_seconds(state.elapsed_s)} in"


def alert_summary(state: AlertState | None) -> AlertView | None:
    """None when the run asked for no alert (no ``runtime.alert_after_s``)."""
    if state is None:
        return None
    after = f"after {fmt_seconds(state.threshold_s)}"
    where = state.webhook or "the webhook"
    if state.state == "armed":
        return AlertView("info", ":material/alarm:", f"Too-long-run alert {after}, to {where}.")
    if state.state == "sending":
        return AlertView(
            "info", ":material/send:", f"Passed its alert {_when(state)}: posting to {where}…"
        )
    if state.state == "sent":
        answer = f" (HTTP {state.http_status})" if state.http_status is not None else ""
        return AlertView(
            "success",
            ":material/notifications_active:",
            f"Too-long-run alert sent to {where}{answer} {_when(state)}.",
        )
    if state.state == "failed":
        return AlertView(
            "warning",
            ":material/notification_important:",
            f"Too-long-run alert failed {_when(state)}: {state.reason or 'no reason recorded'}. "
            "The run itself was not affected.",
        )
    # not_configured
    if state.passed:
        return AlertView(
            "warning",
            ":material/notifications_off:",
            f"Passed its alert of {fmt_seconds(state.threshold_s)} {_when(state)}, but no "
            f"alert was sent: {WEBHOOK_ENV} is not set.",
        )
    return AlertView(
        "info",
        ":material/notifications_off:",
        f"Too-long-run alert {after} is not configured: {WEBHOOK_ENV} is not set.",
    )
