"""compute_facts computes its independent facts on two threads where it has two cores, and
inline on one; the facts are the same either way, on real traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnostics.analyze import analyze_loaded
from diagnostics.facts import assemble
from diagnostics.trace.loader import load

TRACES = Path(__file__).resolve().parents[4] / "shared" / "traces"


def _rounded(value):
    # polars' multi-threaded sums may differ in the last bits from run to run
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


@pytest.mark.parametrize(
    "name",
    ["hta_a100_rank3_of_8.json.gz", "tracelens_mi300x_resnet_ddp_actckpt_rank0_of_8.json.gz"],
)
def test_the_facts_are_the_same_on_one_core_and_on_two(name, monkeypatch):
    loaded = load(TRACES / name)
    inline_calls: list[int] = []
    real_submit = assemble._Inline.submit

    def counted(self, fact, *args):
        inline_calls.append(1)
        return real_submit(self, fact, *args)

    monkeypatch.setattr(assemble._Inline, "submit", counted)
    monkeypatch.setattr(assemble, "usable_cores", lambda: 2)
    on_two = analyze_loaded(loaded).to_json()
    assert inline_calls == []  # the thread pool ran them
    monkeypatch.setattr(assemble, "usable_cores", lambda: 1)
    on_one = analyze_loaded(loaded).to_json()
    assert len(inline_calls) >= 10
    assert _rounded(on_two) == _rounded(on_one)
    assert on_one["findings"] and on_one["summary"]["steps"] > 0


def test_a_failing_fact_raises_as_it_would_inline(monkeypatch):
    loaded = load(TRACES / "hta_a100_alexnet_with_syncs.json.gz")

    def broken(*args):
        raise ValueError("facts.copies failed")

    monkeypatch.setattr(assemble, "copy_table", broken)
    for cores in (1, 2):
        monkeypatch.setattr(assemble, "usable_cores", lambda cores=cores: cores)
        with pytest.raises(ValueError, match="facts.copies failed"):
            assemble.compute_facts(loaded.traces[0].events, loaded.traces[0].metadata)
