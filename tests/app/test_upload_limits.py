"""The Upload page under a decompression/event bomb and an analysis that runs out of memory:
one line on the page, and the server process (here the AppTest process, which runs the
page's script in process as `streamlit run` would) stays small and keeps serving."""

from __future__ import annotations

from pathlib import Path

import pytest

from app_ui.safe_text import shown
from tests.app.test_pages import open_page
from tests.diagnostics.memory_limit import LARGE, TOO_LITTLE_MIB, TOO_LITTLE_SHOWN
from tests.diagnostics.test_isolated import write_event_bomb

# The server may grow by this much while the child analyses a bomb: the upload's bytes,
# the AppTest rerun and the error, never the inflated JSON (~50 MB here) or its table.
SERVER_GROWTH_BOUND_BYTES = 64 << 20


def _reset_peak_rss() -> None:
    # writing 5 to clear_refs resets this process's VmHWM (Linux >= 4.0)
    Path("/proc/self/clear_refs").write_text("5")


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(field)


@pytest.fixture
def upload_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path


def test_event_bomb_upload_shows_one_line_and_the_server_stays_small(upload_env, monkeypatch):
    monkeypatch.setenv("PIPELINE_DOCTOR_MAX_EVENTS", "100000")
    bomb = upload_env / "bomb.json.gz"
    write_event_bomb(bomb, 400_000)  # ~250 KB that inflates to ~50 MB of valid events
    at = open_page("pages/4_Upload_trace.py")
    assert "100,000 events" in " ".join(c.value for c in at.caption)
    at.file_uploader[0].set_value(("bomb.json.gz", bomb.read_bytes(), "application/gzip"))
    before = _rss("VmRSS")
    _reset_peak_rss()
    at.run()
    peak = _rss("VmHWM")
    assert not at.exception
    assert [shown(e.value) for e in at.error] == [
        "bomb.json.gz: holds more than 100,000 events (all files of the input together), "
        "the limit (raise --max-events or PIPELINE_DOCTOR_MAX_EVENTS to read it)"
    ]
    assert peak - before < SERVER_GROWTH_BOUND_BYTES, (before, peak)


def test_analysis_over_its_memory_limit_is_one_line_and_the_server_carries_on(
    upload_env, monkeypatch, shared_traces_dir
):
    # too little address space to read the 216k-event trace: polars may abort (SIGABRT). In
    # the server process that abort would end the app for every user; in the child it is
    # one line, and the next upload is analysed as usual.
    monkeypatch.setenv("PIPELINE_DOCTOR_ANALYSIS_MEMORY_MB", str(TOO_LITTLE_MIB))
    at = open_page("pages/4_Upload_trace.py")
    at.file_uploader[0].set_value((LARGE.name, LARGE.read_bytes(), "application/gzip"))
    at.run()
    assert not at.exception
    assert len(at.error) == 1
    message = shown(at.error[0].value)
    assert message.startswith(f"{LARGE.name}: the analysis needed more than {TOO_LITTLE_SHOWN}")
    assert "\n" not in message

    monkeypatch.setenv("PIPELINE_DOCTOR_ANALYSIS_MEMORY_MB", "8192")
    small = shared_traces_dir / "kineto_resnet50_num_workers_0.pt.trace.json.gz"
    other = open_page("pages/4_Upload_trace.py")
    other.file_uploader[0].set_value((small.name, small.read_bytes(), "application/gzip"))
    other.run()
    assert not other.exception and not other.error
    assert "Findings" in [s.value for s in other.subheader]
