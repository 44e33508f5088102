from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from diagnostics.compare import compare
from diagnostics.report.html import (
    BOOTSTRAP_SCRIPT_ID,
    FIGURES_SCRIPT_ID,
    PLOTLY_SCRIPT_ID,
    json_for_script,
    render_html,
)
from diagnostics.report.model import build_comparison_report, build_report
from tests.diagnostics.report import fakes
from tests.diagnostics.report.fakes import BREAKOUT, HOSTILE


class Page(HTMLParser):
    """Collects what the safety and structure checks need from a parsed page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.scripts: list[dict[str, str | None]] = []
        self.script_text: list[str] = []
        self.links: list[dict[str, str | None]] = []
        self.ids: list[str] = []
        self.classes: list[str] = []
        self.event_handlers: list[tuple[str, str]] = []
        self.text: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if attributes.get("id"):
            self.ids.append(attributes["id"])
        if attributes.get("class"):
            self.classes.append(attributes["class"])
        self.event_handlers.extend((tag, a) for a, _ in attrs if a.lower().startswith("on"))
        if tag == "script":
            self.scripts.append(attributes)
            self._in_script = True
            self.script_text.append("")
        if tag in ("link", "img", "iframe", "a", "source", "embed", "object"):
            self.links.append(attributes)

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.script_text[-1] += data
        else:
            self.text.append(data)


def parse(document: str) -> Page:
    page = Page()
    page.feed(document)
    page.close()
    return page


def test_report_parses_with_sections_and_findings_in_order(run_result):
    document = render_html(build_report(run_result))
    assert document.startswith("<!DOCTYPE html>")
    page = parse(document)
    for section in ("source", "environment", "summary", "findings", "cost", "charts", "config"):
        assert section in page.ids
    finding_classes = [c for c in page.classes if c.startswith("finding ")]
    assert finding_classes == [
        "finding sev-high",
        "finding sev-high",
        "finding sev-medium",
        "finding sev-low",
    ]
    # Titles in the same order as the articles.
    text = "".join(page.text)
    positions = [
        text.index(f"{rule} fired")
        for rule in ("slow-data", "too-few-workers", "missing-pin-memory", "small-batch")
    ]
    assert positions == sorted(positions)
    assert "data.num_workers" in text and "Re-run with it" in text
    assert "loader = DataLoader(ds, num_workers=4)" in text


def test_self_contained_plotly_inlined_once_and_figures_drawn(run_result):
    document = render_html(build_report(run_result))
    page = parse(document)
    assert [s.get("id") for s in page.scripts] == [
        PLOTLY_SCRIPT_ID,
        FIGURES_SCRIPT_ID,
        BOOTSTRAP_SCRIPT_ID,
    ]
    assert all(not s.get("src") for s in page.scripts)
    assert not [
        link
        for link in page.links
        if re.match(r"^(https?:)?//", link.get("href") or link.get("src") or "")
    ]
    assert page.script_text[0].count("plotly.js v") >= 1 and len(page.script_text[0]) > 1_000_000
    assert document.count(page.script_text[0][:200]) == 1  # the library is in the file once
    figures = json.loads(page.script_text[1])
    # 4 charts (step time, loss, memory, system) and the one finding with a chart.
    assert len(figures) == 5
    for fig_id, figure in figures.items():
        assert fig_id in page.ids
        assert figure["layout"]["title"]["text"]


def test_hostile_names_are_escaped_and_never_executable(hostile_result):
    document = render_html(build_report(hostile_result))
    page = parse(document)
    # Only the library, the data block and the bootstrap: nothing a name could add.
    assert [s.get("id") for s in page.scripts] == [
        PLOTLY_SCRIPT_ID,
        FIGURES_SCRIPT_ID,
        BOOTSTRAP_SCRIPT_ID,
    ]
    assert page.scripts[1].get("type") == "application/json"
    assert page.event_handlers == []
    # The payloads appear only escaped: never raw anywhere in the markup or the data block.
    without_library = document.replace(page.script_text[0], "")
    assert HOSTILE not in without_library
    assert "</script><script>" not in without_library
    assert "<!--" not in without_library
    assert without_library.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 8
    # As visible text the reader sees the names literally.
    text = "".join(page.text)
    assert HOSTILE in text and BREAKOUT in text
    # The data block parses back to exactly the escaped label plotly shows as text.
    figures = json.loads(page.script_text[1])
    assert HOSTILE not in json.dumps(figures)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in json.dumps(figures, ensure_ascii=False)


def test_hostile_real_trace_through_the_analyser(hostile_trace_file):
    from diagnostics.analyze import analyze

    report = build_report(analyze(hostile_trace_file))
    document = render_html(report)
    page = parse(document)
    assert [s.get("id") for s in page.scripts] == [
        PLOTLY_SCRIPT_ID,
        FIGURES_SCRIPT_ID,
        BOOTSTRAP_SCRIPT_ID,
    ]
    assert page.event_handlers == []
    without_library = document.replace(page.script_text[0], "")
    for raw in (HOSTILE, "</script><script>", "<!--", "<img src=x"):
        assert raw not in without_library
    text = "".join(page.text)
    # The file name and the GPU name are shown, literally, as text.
    assert "<img src=x onerror=alert(1)>.json" in text and HOSTILE in text
    # The operator and kernel names reach the top-N charts, escaped for plotly.
    figures = json.loads(page.script_text[1])
    labels = json.dumps(figures, ensure_ascii=False)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in labels
    assert "&lt;/script&gt;&lt;script&gt;alert(&quot;x&quot;)" in labels


def test_hostile_run_folder_through_the_analyser(hostile_result):
    from diagnostics.analyze import analyze

    # The hand-made result's run folder is a real one (RunWriter): read it as the app does.
    report = build_report(analyze(hostile_result.run.folder.path))
    document = render_html(report)
    page = parse(document)
    assert [s.get("id") for s in page.scripts] == [
        PLOTLY_SCRIPT_ID,
        FIGURES_SCRIPT_ID,
        BOOTSTRAP_SCRIPT_ID,
    ]
    without_library = document.replace(page.script_text[0], "")
    assert HOSTILE not in without_library and "</script><script>" not in without_library
    text = "".join(page.text)
    # Config keys and values and the environment's GPU name, shown literally.
    assert (HOSTILE, BREAKOUT) in report.config_rows
    assert HOSTILE in text and BREAKOUT in text


def test_json_for_script_cannot_close_the_block():
    text = json_for_script({"name": BREAKOUT, "amp": "a&b", "sep": "\u2028"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"name": BREAKOUT, "amp": "a&b", "sep": "\u2028"}


def test_comparison_html(run_data, mixed_findings):
    a = fakes.run_result(run_data, mixed_findings)
    b = fakes.trace_result(mixed_findings[:1])
    page = parse(render_html(build_comparison_report(compare(a, b))))
    assert "comparison" in page.ids
    text = "".join(page.text)
    assert "Findings gone" in text and "ratio b/a" in text


@pytest.mark.browser
def test_hostile_report_runs_nothing_in_a_real_browser(hostile_result, tmp_path):
    from playwright import sync_api as playwright

    path = tmp_path / "hostile.html"
    path.write_text(render_html(build_report(hostile_result)), encoding="utf-8")
    dialogs, errors, requests = [], [], []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page()
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        page.goto(path.as_uri())
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 7")
        drawn = page.locator(".js-plotly-plot").count()
        # The op name is drawn as text in the top-operators chart, not run.
        labels = page.locator(".js-plotly-plot text").all_text_contents()
        browser.close()
    assert dialogs == [] and errors == []
    assert [url for url in requests if not url.startswith("file:")] == []
    # Run: step time, loss, memory (no samples: no system chart); trace: breakdown, top
    # operators, top kernels; plus the finding's evidence chart: 3 + 3 + 1.
    assert drawn == 7
    assert any(HOSTILE in label for label in labels)


@pytest.mark.browser
def test_price_input_recomputes_cost_and_print_hides_controls(run_result, tmp_path):
    from playwright import sync_api as playwright

    path = tmp_path / "run.html"
    path.write_text(render_html(build_report(run_result)), encoding="utf-8")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(path.as_uri())
        page.fill("#price-input", "72")
        cells = page.locator("[data-gpu-hours]").all_text_contents()
        page.emulate_media(media="print")
        nav_display = page.eval_on_selector("nav", "el => getComputedStyle(el).display")
        browser.close()
    # Now: 1,000 steps x 100 ms = 100 s, and 125 steps x 100 ms = 12.5 s an epoch, on one
    # GPU at $72/h ($0.02 a second): $2.00 and $0.25.
    assert cells[0] == "$2.00" and cells[2] == "$0.25"
    assert nav_display == "none"
