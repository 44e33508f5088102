"""End to end in Debian's Chromium: the drill-down views on a real run and on the large
shared trace, the mismatched-upload question, and a console that stays clean offline.

Screenshots of every view go to test-artifacts/screenshots/views-*.png.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.app.conftest import SCREENSHOTS, AppServer, screenshot, serving
from tests.app.test_e2e import goto, pick_option, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.slow]
expect.set_options(timeout=60_000)

TABS = ("Overview", "Operators", "Kernels", "Memory", "Timeline", "Export")
LARGE = "hta_v100_rank1_of_2_large.json.gz"
H200_RUN = "h200-sized/m768l6b256"
PAGES = ("", "Launch", "Runs", "Run_detail", "Upload_trace", "Compare", "Rules")
# Streamlit's frontend, opened on a page's own URL, first probes <page>/_stcore/health and
# /host-config and gets 404 before it finds the server root (streamlit/streamlit#7074).
STREAMLIT_SUBPAGE_PROBE = re.compile(r"/[A-Za-z_]+/_stcore/(health|host-config)$")


@pytest.fixture(scope="module")
def runs_server(trained_runs, tmp_path_factory) -> Iterator[AppServer]:
    """The app on the real runs of ``trained_runs`` (slow-loader and its re-run)."""
    log = tmp_path_factory.mktemp("views-server") / "streamlit.log"
    with serving(trained_runs.runs_dir, log) as server:
        yield server


def drill_tabs(page):
    """The drill-down's tab set: the page's last (the charts above have tabs too)."""
    return page.locator('[data-testid="stTabs"]').last


def open_tab(page, name: str) -> None:
    drill_tabs(page).get_by_role("tab", name=name, exact=True).click()
    wait_idle(page)


def tab_panel(page):
    return drill_tabs(page).locator('[role="tabpanel"]:visible').first


def walk_views(page, prefix: str, tmp_path: Path, cpu_run: bool = False) -> dict:
    """Opens every drill-down tab, checks it drew, saves a screenshot; returns the export."""
    page.get_by_role("heading", name="Drill down").scroll_into_view_if_needed()
    shots = {}
    draw_s = {}
    for name in TABS:
        started = time.monotonic()
        open_tab(page, name)
        panel = tab_panel(page)
        if name in ("Overview", "Memory", "Timeline"):
            expect(panel.locator(".js-plotly-plot").first).to_be_visible()
        if name == "Kernels" and cpu_run:  # no empty table: it says why there is none
            expect(panel.get_by_text("No GPU kernels in this trace (a CPU run).")).to_be_visible()
            expect(panel.locator('[data-testid="stDataFrame"]')).to_have_count(0)
        elif name in ("Operators", "Kernels"):
            expect(panel.locator('[data-testid="stDataFrame"]').first).to_be_visible()
        if name == "Export":
            expect(panel.get_by_role("button", name=re.compile("Download step"))).to_be_visible()
        # from the click to the tab's chart or table on screen, the app idle again
        draw_s[name] = round(time.monotonic() - started, 2)
        panel.scroll_into_view_if_needed()
        shots[name] = screenshot(page, f"views-{prefix}-{name.lower()}", full_page=False)
    assert all(path.exists() for path in shots.values())
    # the figures docs/VIEWS.md quotes (wall time in this browser, on this machine)
    print(f"{prefix}: draw time per tab (s): {draw_s}")
    (SCREENSHOTS.parent / f"view-draw-times-{prefix}.json").write_text(json.dumps(draw_s))
    # Export: the step's slice downloads as Chrome-trace JSON
    open_tab(page, "Export")
    expect(page.get_by_text("ui.perfetto.dev").first).to_be_visible()
    with page.expect_download() as download:
        page.get_by_role("button", name=re.compile(r"Download step \d+ as a Chrome trace")).click()
    path = tmp_path / f"{prefix}-step.json"
    download.value.save_as(path)
    return json.loads(path.read_text())


def test_drill_down_views_on_a_real_run(runs_server, page, tmp_path, trained_runs):
    goto(page, runs_server, f"Run_detail?run={trained_runs.slow.name}")
    page.get_by_role("heading", name="Drill down").wait_for(timeout=120_000)
    document = walk_views(page, "run", tmp_path, cpu_run=True)
    names = {e.get("name") for e in document["traceEvents"]}
    assert any(str(n).startswith("aten::") for n in names)
    assert any(e.get("name") == "[memory]" for e in document["traceEvents"])


def test_drill_down_views_on_the_large_shared_trace(app_server, page, shared_traces_dir, tmp_path):
    goto(page, app_server, "Upload_trace")
    started = time.monotonic()
    page.locator('input[type="file"]').set_input_files(str(shared_traces_dir / LARGE))
    page.get_by_role("heading", name="Drill down").wait_for(timeout=180_000)
    wait_idle(page)
    print(f"large trace: upload to drill-down in {time.monotonic() - started:.1f} s")
    open_tab(page, "Timeline")
    started = time.monotonic()
    pick_option(
        tab_panel(page).locator('[data-testid="stSelectbox"]').filter(has_text="Profiler step"),
        page.get_by_role("option", name="2", exact=True),
    )
    wait_idle(page)
    expect(tab_panel(page).locator(".js-plotly-plot").first).to_be_visible()
    print(f"large trace: timeline of another step redrawn in {time.monotonic() - started:.1f} s")
    document = walk_views(page, "large", tmp_path)
    assert document["distributedInfo"]["rank"] == 1
    cats = {e.get("cat") for e in document["traceEvents"]}
    assert {"kernel", "cpu_op", "cuda_runtime", "ac2g"} <= cats


def test_mismatched_uploads_ask_before_merging(app_server, page, shared_traces_dir, repo_root):
    goto(page, app_server, "Upload_trace")
    v100 = shared_traces_dir / "kineto_resnet50_num_workers_0.pt.trace.json.gz"
    h200 = next((repo_root.parent / "shared" / "gpu-runs" / H200_RUN / "trace").glob("*.gz"))
    page.locator('input[type="file"]').set_input_files([str(v100), str(h200)])
    question = page.get_by_text("These files may not be ranks of one job")
    question.wait_for(timeout=120_000)
    wait_idle(page)
    expect(page.get_by_text(re.compile("GPU models differ")).first).to_be_visible()
    expect(page.get_by_text("Median step time")).to_have_count(0)  # nothing merged yet
    screenshot(page, "views-upload-mismatch-question")
    page.get_by_role("button", name="Analyse each file separately").click()
    page.get_by_role("heading", name="Findings").wait_for(timeout=120_000)
    wait_idle(page)
    expect(page.get_by_text("Analysed separately: show")).to_be_visible()
    screenshot(page, "views-upload-separately")


def test_every_page_stays_offline_with_a_clean_console(runs_server, browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    external: list[str] = []

    def only_local(route):
        if route.request.url.startswith(runs_server.url):
            route.continue_()
        else:  # as if offline: anything from another host fails
            external.append(route.request.url)
            route.abort()

    context.route("**/*", only_local)
    page = context.new_page()
    problems: list[str] = []
    page.on(
        "console",
        lambda m: (
            problems.append(f"{page.url}: {m.text} ({m.location.get('url')})")
            if m.type == "error" and not STREAMLIT_SUBPAGE_PROBE.search(m.location.get("url", ""))
            else None
        ),
    )
    try:
        for path in PAGES:
            goto(page, runs_server, path)
            page.wait_for_timeout(1500)  # late requests (favicons, fonts, images)
    finally:
        context.close()
    assert external == []
    assert problems == []
