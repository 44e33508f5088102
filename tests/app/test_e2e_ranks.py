"""In Chromium: a distributed run's per-rank table and chart on Run detail, and Compare of
two 2-rank runs (healthy vs straggler), made by the real trainer under torchrun."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import expect

from diagnostics.analyze import analyze
from diagnostics.views.ranks import RANK_TABLE_LABELS, straggler_ranks
from tests.app.conftest import AppServer, screenshot, serving
from tests.app.test_e2e import goto, wait_idle
from tests.conftest import STRAGGLER_DELAY_MS

pytestmark = [pytest.mark.browser, pytest.mark.slow]
expect.set_options(timeout=60_000)  # a busy CI machine renders slowly


@dataclass(frozen=True)
class RankServer:
    server: AppServer
    healthy: Path
    straggler: Path


@pytest.fixture(scope="module")
def rank_server(tmp_path_factory: pytest.TempPathFactory, two_rank_runs) -> Iterator[RankServer]:
    """The app serving the session's two 2-rank runs (their folder holds nothing else)."""
    log = tmp_path_factory.mktemp("rank-server") / "streamlit.log"
    with serving(two_rank_runs.runs_dir, log) as server:
        yield RankServer(server, two_rank_runs.healthy, two_rank_runs.straggler)


def no_error_on(page) -> None:
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)
    expect(page.locator('[data-testid="stAlertContentError"]')).to_have_count(0)


def test_run_detail_shows_each_rank_and_compare_takes_two_distributed_runs(rank_server, page):
    server, straggler = rank_server.server, rank_server.straggler
    goto(page, server, f"Run_detail?run={straggler.name}")
    # exact: the run's own heading ("straggler-2-ranks") holds the word too
    page.get_by_role("heading", name="Ranks", exact=True).wait_for(timeout=120_000)
    wait_idle(page)
    no_error_on(page)

    table = page.locator('[data-testid="stTable"]').filter(has_text=RANK_TABLE_LABELS["straggler"])
    expect(table).to_have_count(1)
    header = [cell.strip() for cell in table.locator("thead th").all_inner_texts()]
    assert header == list(RANK_TABLE_LABELS.values())
    rows = [
        [cell.strip() for cell in row.locator("th, td").all_inner_texts()]
        for row in table.locator("tbody tr").all()
    ]
    assert [row[0] for row in rows] == ["0", "1"]
    # marked exactly as the page's analysis names stragglers (the same files, the same rules)
    expected = set(straggler_ranks(analyze(straggler).findings))
    marked = {int(row[0]) for row in rows if row[-1] == "straggler"}
    assert marked == expected == {1}
    page.get_by_text(re.compile(r"Straggler ranks?: ")).first.wait_for()
    # rank 1 waits the session's extra STRAGGLER_DELAY_MS a batch for its data; rank 0 not
    data_wait = header.index(RANK_TABLE_LABELS["data_wait_ms"])
    assert float(rows[1][data_wait]) > STRAGGLER_DELAY_MS - 50.0 > float(rows[0][data_wait])

    # the title exactly: a rank-stragglers finding's own chart is "Mean step time per rank"
    title = page.locator(".gtitle", has_text=re.compile(r"^Step time per rank$"))
    chart = page.locator('[data-testid="stPlotlyChart"]').filter(has=title)
    expect(chart).to_have_count(1)
    expect(chart.locator(".legendtext")).to_have_count(2)
    legend = chart.locator(".legendtext").all_text_contents()  # SVG text: no innerText
    assert [name.split(" (")[0] for name in legend] == ["rank 0", "rank 1"]
    expect(chart.locator(".xtitle")).to_have_text("step")
    expect(chart.locator(".ytitle")).to_have_text("step time (ms)")
    screenshot(page, "run-detail-ranks")

    goto(page, server, f"Compare?a={rank_server.healthy.name}&b={straggler.name}")
    page.get_by_text(re.compile(r"B is [0-9.]+× (faster|slower): median step")).wait_for()
    ranks = page.locator('[data-testid="stTable"]').filter(has_text="Slowest rank's step time")
    expect(ranks).to_have_count(1)
    ranks_row = ranks.locator("tbody tr").filter(has_text="Ranks").first
    assert [c.strip() for c in ranks_row.locator("th, td").all_inner_texts()][-3:] == [
        "2",
        "2",
        "1.00×",
    ]
    expect(ranks.locator("tbody tr").filter(has_text="Longest data wait")).to_contain_text(
        "(rank 1)"
    )
    no_error_on(page)
    screenshot(page, "compare-ranks")
