"""A CPU run's reports price it per vCPU-hour at the price's real value (issue 11: a CPU
run priced "per GPU-hour"; then $0.0425 a vCPU-hour printed as "$0.04")."""

from __future__ import annotations

import json
import re

from diagnostics.analyze import analyze
from diagnostics.report.html import render_html
from diagnostics.report.json_report import render_json
from diagnostics.report.markdown import render_markdown
from diagnostics.report.model import build_report
from diagnostics.report.pricing import CPU_ENTRY, price_named


def test_a_real_cpu_runs_reports_say_per_vcpu_hour_with_the_full_price(tiny_run):
    report = build_report(analyze(tiny_run))
    cost = report.cost
    assert cost is not None and (cost.unit, cost.gpu) == ("vCPU", CPU_ENTRY)
    price = price_named(CPU_ENTRY).on_demand_usd_per_hour
    assert cost.usd_per_gpu_hour == price == 0.0425
    markdown = render_markdown(report)
    html = render_html(report)
    assert "At $0.0425 per vCPU-hour" in markdown
    assert "At <strong>$0.0425 per vCPU-hour</strong>" in html
    for document in (markdown, html):
        # the cost section never calls the CPU run's price per GPU-hour, nor rounds it
        section = document[document.index("Cost") :]
        lead = section[: section.index("vCPU-hour") + len("vCPU-hour")]
        assert "GPU-hour" not in lead
        assert re.search(r"\$0\.0125\b", section), "the spot price of a vCPU, in the table"
    data = json.loads(render_json(report))["report"]["cost"]
    assert (data["unit"], data["usd_per_gpu_hour"]) == ("vCPU", 0.0425)
