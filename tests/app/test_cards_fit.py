"""The summary cards show their whole label and value at the widths people use (1280 and
1400 px, the sidebar open): Streamlit cuts an overflowing card with an ellipsis ("134…",
"Median st…"), which hides the number the card is for.

Real material in Debian's Chromium: this project's trainer on an NVIDIA H200
(../shared/gpu-runs/h200-default: eight cards, the two FLOPs figures included) on Run
detail and on Compare (the slow-loader run and its re-run with the fix), and a real
torch.profiler trace (the Kineto ResNet-50 one, V100) on Upload. A card is cut when any
element inside it is wider than its box (``scrollWidth > clientWidth``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.app.conftest import AppServer, screenshot, serving
from tests.app.test_e2e import goto, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.slow]
expect.set_options(timeout=60_000)

WIDTHS = (1280, 1400)
SLOW, FIXED = "gpu-slow-loader", "gpu-slow-loader-fixed"

# every element inside a card whose content is wider than its box, with its text
CUT_CARDS = """() => {
  const cut = [];
  for (const card of document.querySelectorAll('[data-testid="stMetric"]')) {
    for (const el of [card, ...card.querySelectorAll('*')]) {
      if (el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0) {
        cut.push({text: el.innerText.trim(), scroll: el.scrollWidth, client: el.clientWidth});
      }
    }
  }
  return cut;
}"""


@pytest.fixture(scope="module")
def h200_server(repo_root, tmp_path_factory) -> Iterator[AppServer]:
    """The app over a copy of the H200 runs (the shared folder stays untouched)."""
    base = tmp_path_factory.mktemp("h200-server")
    runs = base / "runs"
    shutil.copytree(repo_root.parent / "shared" / "gpu-runs" / "h200-default", runs)
    with serving(runs, base / "streamlit.log") as server:
        yield server


def _cards(page) -> list[str]:
    page.locator('[data-testid="stMetric"]').first.wait_for()
    wait_idle(page)
    return page.locator('[data-testid="stMetric"]').all_inner_texts()


def _assert_whole(page, where: str, expected_cards: int) -> None:
    cards = _cards(page)
    assert len(cards) >= expected_cards, (where, cards)
    cut = page.evaluate(CUT_CARDS)
    assert cut == [], f"{where}: cut cards {cut}"


@pytest.fixture(params=WIDTHS, ids=lambda w: f"{w}px")
def narrow_page(browser, request):
    context = browser.new_context(viewport={"width": request.param, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        yield page, request.param
    finally:
        context.close()


def test_run_detail_and_compare_cards_are_whole(h200_server, narrow_page):
    page, width = narrow_page
    goto(page, h200_server, f"Run_detail?run={SLOW}")
    page.get_by_role("heading", name="Findings").wait_for()
    # a GPU run: step time, throughput, the two GPU figures, data wait, memory, MFU, HFU
    _assert_whole(page, f"Run detail at {width} px", 8)
    screenshot(page, f"cards-run-detail-{width}", full_page=False)

    goto(page, h200_server, f"Compare?a={SLOW}&b={FIXED}")
    page.get_by_role("heading", name="Findings").wait_for()
    _assert_whole(page, f"Compare at {width} px", 6)
    screenshot(page, f"cards-compare-{width}", full_page=False)


def test_upload_cards_are_whole(app_server, narrow_page, shared_traces_dir):
    page, width = narrow_page
    goto(page, app_server, "Upload_trace")
    trace = shared_traces_dir / "kineto_resnet50_num_workers_0.pt.trace.json.gz"
    page.locator('input[type="file"]').set_input_files(str(trace))
    page.get_by_role("heading", name="Findings").wait_for(timeout=180_000)
    _assert_whole(page, f"Upload at {width} px", 6)
    screenshot(page, f"cards-upload-{width}", full_page=False)
