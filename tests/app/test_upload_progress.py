"""AppTest: a long upload draws a progress bar from the bounded child's reports (one trace:
the MB of it read, then each fact; four files: each rank file read and analysed, in one
pass) and removes it once the analysis is in."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app_ui import render
from tests.app.test_pages import open_page
from tests.diagnostics.trace.helpers import SHARED_TRACES, write_rank_copies

# a real trace of 51 MB of JSON, 2.9 MB as stored
LARGE_REAL = SHARED_TRACES / "hta_v100_rank1_of_2_large.json.gz"


def _bar_script() -> None:
    from app_ui.render import ProgressBar
    from diagnostics.progress import WorkDone

    bar = ProgressBar()
    bar(WorkDone("rank files analysed", 0, 4, 0.0))
    bar(WorkDone("rank files analysed", 3, 4, 1.2))


def test_the_bar_shows_the_latest_report():
    at = AppTest.from_function(_bar_script).run()
    [bar] = at.get("progress")
    assert bar.proto.value == 75
    assert bar.proto.text == "3 of 4 rank files analysed (75 %, 1 s)"


@pytest.fixture
def four_rank_uploads(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(tmp_path / "runs"))
    return write_rank_copies(tmp_path, [0, 1, 2, 3])


def _upload_drawing_bars(monkeypatch, uploads):
    """The Upload page run on ``uploads`` (name, bytes), with what its bar was given:
    (what, done, total) of each report, in order."""
    drawn = []
    real_call = render.ProgressBar.__call__

    def recorded(self, work):
        drawn.append((work.what, work.done, work.total))
        real_call(self, work)

    monkeypatch.setattr(render.ProgressBar, "__call__", recorded)
    at = open_page("pages/4_Upload_trace.py")
    at.file_uploader[0].set_value([(name, data, "application/gzip") for name, data in uploads])
    at.run(timeout=240)
    assert not at.exception and not at.error
    assert at.get("progress") == []  # removed once the analysis is in
    assert any("Findings" in h.value for h in at.subheader)
    return drawn


def test_four_rank_files_draw_a_bar_from_the_childs_reports_then_remove_it(
    four_rank_uploads, monkeypatch
):
    drawn = _upload_drawing_bars(monkeypatch, [(p.name, p.read_bytes()) for p in four_rank_uploads])
    # the child's file is read every 0.25 s, so counts may be passed over, but not the last
    # one pass over the files: no "files read" phase before the pool's
    assert {what for what, _, _ in drawn} == {"rank files analysed"}
    assert drawn == sorted(drawn) and drawn[-1] == ("rank files analysed", 4, 4)


def test_one_large_trace_draws_its_read_then_its_facts(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(tmp_path / "runs"))
    drawn = _upload_drawing_bars(monkeypatch, [(LARGE_REAL.name, LARGE_REAL.read_bytes())])
    # read every 0.25 s from the child's file: figures may be passed over, not the last
    assert {what for what, _, _ in drawn} <= {"MB of the trace read", "facts computed"}
    order = ["MB of the trace read", "facts computed"]
    assert drawn == sorted(drawn, key=lambda d: (order.index(d[0]), d[1]))
    assert drawn[-1] == ("facts computed", 16, 16)
