"""The too-long-run alert: one post to a webhook when a run passes ``alert_after_s``.

A timer thread waits out the threshold, so a run stuck inside one step still alerts, and the
training thread pays nothing per step. The post has a short timeout and every failure is
caught: the alert never fails or stalls the run, it only records what happened in the run
folder's ``alert.json`` (diagnostics.runs.ALERT_FILE, read by ``RunFolder.alert()``).

The webhook URL is a secret (a Slack incoming webhook's path is its credential), so only
its host is ever written down. Imports no torch: the profile wrapper uses it too.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagnostics.runs import ALERT_FILE, write_alert_state

ALERT_WEBHOOK_ENV = "PIPELINE_DOCTOR_ALERT_WEBHOOK"
# long enough for a webhook across the internet, short enough that a run ending while the
# post is in flight waits at most this long for its answer
ALERT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class AlertMoment:
    """Where the run stood when it passed the threshold."""

    run_id: str
    host: str
    step: int | None
    total_steps: int | None
    elapsed_s: float
    threshold_s: float

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the pace so far; unknown without a step done or a known end."""
        if not self.step or self.total_steps is None or self.step > self.total_steps:
            return None
        return self.elapsed_s / self.step * (self.total_steps - self.step)


def alert_text(moment: AlertMoment) -> str:
    """The message: run, step, elapsed time, ETA and host, on one line."""
    if moment.step is None:
        where = "step unknown"
    elif moment.total_steps is None:
        where = f"step {moment.step}"
    else:
        where = f"step {moment.step} of {moment.total_steps}"
    eta = "ETA unknown" if moment.eta_s is None else f"ETA {moment.eta_s:.0f} s"
    return (
        f"Pipeline Doctor: run {moment.run_id} on {moment.host} has run "
        f"{moment.elapsed_s:.0f} s, past its alert of {moment.threshold_s:g} s; "
        f"{where}, {eta}"
    )


def webhook_host(url: str) -> str:
    """What of the URL may be written down: scheme, host and port, no path or query."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


class AlertPostError(Exception):
    """The post did not get a 2xx answer; ``str()`` says why in one line."""


def post_alert(url: str, text: str, timeout_s: float = ALERT_TIMEOUT_S) -> int:
    """POSTs Slack's ``{"text": ...}`` body; the HTTP status, or AlertPostError."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AlertPostError(f"{ALERT_WEBHOOK_ENV} is not an http(s) URL")
    request = urllib.request.Request(
        url,
        data=json.dumps({"text": text}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        raise AlertPostError(f"the webhook answered HTTP {exc.code}") from None
    except TimeoutError:  # socket.timeout is an alias of it
        raise AlertPostError(f"timed out after {timeout_s:g} s") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise AlertPostError(f"timed out after {timeout_s:g} s") from None
        raise AlertPostError(f"could not reach the webhook ({exc.reason})") from None
    except (OSError, ValueError) as exc:  # a reset connection, a malformed answer
        raise AlertPostError(f"the post failed ({' '.join(str(exc).split())})") from None


class RunAlert:
    """Arms the alert for one run; ``close()`` at the run's end.

    ``step`` and ``total_steps`` are called from the timer thread when it fires: they must
    be cheap reads (an attribute, a small file), and may return None when unknown.
    """

    def __init__(
        self,
        run_dir: Path,
        threshold_s: float,
        *,
        step: Callable[[], int | None],
        total_steps: Callable[[], int | None],
        environ: Mapping[str, str],
        started: float | None = None,
        timeout_s: float = ALERT_TIMEOUT_S,
    ):
        self.run_dir = Path(run_dir)
        self.threshold_s = float(threshold_s)
        self._step = step
        self._total_steps = total_steps
        self._url = environ.get(ALERT_WEBHOOK_ENV, "").strip() or None
        self._started = time.monotonic() if started is None else started
        self._timeout_s = timeout_s
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self._closed = False

    def _write(self, state: str, **fields: Any) -> None:
        with self._lock:
            if self._closed and state != "failed":
                return
            # a full disk: the training thread meets it at its next write and says so
            with contextlib.suppress(OSError):
                write_alert_state(
                    self.run_dir,
                    {
                        "state": state,
                        "threshold_s": self.threshold_s,
                        "webhook": webhook_host(self._url) if self._url else None,
                        "updated_at": time.time(),
                        **fields,
                    },
                )

    def start(self) -> None:
        """Writes the armed state and starts the timer; once per run, resumes included."""
        if _already_passed(self.run_dir):
            return  # a resumed run that passed its threshold before: one alert a run
        self._write("armed" if self._url else "not_configured")
        wait_s = max(0.0, self.threshold_s - (time.monotonic() - self._started))
        self._timer = threading.Timer(wait_s, self._fire)
        self._timer.name = "run-alert"
        self._timer.daemon = True
        self._timer.start()

    def _moment(self) -> AlertMoment:
        def safe(read: Callable[[], int | None]) -> int | None:
            try:
                return read()
            except Exception:  # a half-written file: unknown, not a failed run
                return None

        return AlertMoment(
            run_id=self.run_dir.name,
            host=socket.gethostname(),
            step=safe(self._step),
            total_steps=safe(self._total_steps),
            elapsed_s=time.monotonic() - self._started,
            threshold_s=self.threshold_s,
        )

    def _fire(self) -> None:
        moment = self._moment()
        text = alert_text(moment)
        facts = {"step": moment.step, "elapsed_s": round(moment.elapsed_s, 3), "text": text}
        if self._url is None:
            self._write("not_configured", reason=f"{ALERT_WEBHOOK_ENV} is not set", **facts)
            return
        self._write("sending", **facts)
        try:
            status = post_alert(self._url, text, self._timeout_s)
        except AlertPostError as exc:
            self._write("failed", reason=str(exc), **facts)
            return
        self._write("sent", http_status=status, **facts)

    def close(self) -> None:
        """At the run's end: a timer not yet fired is cancelled; a post in flight gets up
        to its timeout to answer, then is recorded as unanswered."""
        timer = self._timer
        if timer is None:
            return
        timer.cancel()
        if timer.is_alive():
            timer.join(self._timeout_s + 1.0)
        with self._lock:
            self._closed = True
        if timer.is_alive():
            self._write("failed", reason="the run ended before the webhook answered")


def _already_passed(run_dir: Path) -> bool:
    try:
        raw = json.loads((Path(run_dir) / ALERT_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and raw.get("elapsed_s") is not None
