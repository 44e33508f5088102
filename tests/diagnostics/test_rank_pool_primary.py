"""The rank pool: rank 0's worker sends back its trace and full facts, so the parent never
loads the primary rank a second time; the other ranks' workers compute only the part of the
facts the per-rank table reads; each finished file is reported as progress."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import diagnostics.analyze as analyze_module
from diagnostics.analyze import analyze, analyze_loaded
from diagnostics.facts import compute_facts
from diagnostics.rank_pool import digest_files
from diagnostics.sources import RankFacts, TraceFacts
from diagnostics.trace.loader import LoadedInput, load_trace_file, load_trace_files
from tests.diagnostics.trace.helpers import write_rank_copies


def assert_close(a: pl.DataFrame, b: pl.DataFrame) -> None:
    # to the last bits: polars sums floats over threads in no fixed order
    assert_frame_equal(a, b, rel_tol=1e-9, abs_tol=1e-9)


@pytest.fixture(scope="module")
def ranks_0_to_3(tmp_path_factory) -> list[Path]:
    return write_rank_copies(tmp_path_factory.mktemp("ranks0"), [0, 1, 2, 3])


def test_rank_0s_worker_sends_its_trace_and_full_facts_and_the_others_only_theirs(
    ranks_0_to_3,
):
    reports = []
    digests = digest_files(ranks_0_to_3, [p.name for p in ranks_0_to_3], progress=reports.append)
    assert [d.metadata.rank for d in digests] == [0, 1, 2, 3]
    shipped = digests[0].primary
    assert shipped is not None and all(d.primary is None for d in digests[1:])
    trace, facts = shipped
    assert isinstance(facts, TraceFacts) and all(isinstance(d.facts, RankFacts) for d in digests)
    # the very table and facts the parent would have made by loading the file itself; the
    # flows are left out (the analysis reads none), and counted
    again = load_trace_file(ranks_0_to_3[0], display_name=ranks_0_to_3[0].name)
    assert trace.events.equals(again.events)
    assert trace.flows.height == 0 and again.flows.height > 0
    assert trace.metadata.flow_count == again.metadata.flow_count
    here = compute_facts(again.events, again.metadata)
    for name in ("kernels", "operators", "breakdown", "idle_gaps"):
        assert_close(getattr(facts, name), getattr(here, name))
    # progress: the start, then each file as it ends, counted up to all four
    assert [r.done for r in reports] == [0, 1, 2, 3, 4]
    assert {r.total for r in reports} == {4} and {r.what for r in reports} == {
        "rank files analysed"
    }
    assert reports[-1].fraction == 1.0


def test_the_parent_does_not_load_rank_0_again(ranks_0_to_3, monkeypatch):
    def no_second_load(*args, **kwargs):
        raise AssertionError("the primary rank was loaded a second time")

    monkeypatch.setattr(analyze_module, "load_trace_file", no_second_load)
    result = analyze(ranks_0_to_3[0].parent)
    assert result.source["ranks"] == [0, 1, 2, 3]
    assert result.summary["ranks"]["count"] == 4


def test_without_a_rank_0_the_lowest_is_loaded_and_the_analysis_is_the_same(
    ranks_0_to_3, tmp_path, monkeypatch
):
    write_rank_copies(tmp_path, [4, 5, 6, 7])
    loads = []
    real_load = analyze_module.load_trace_file

    def counted(path, **kwargs):
        loads.append(Path(path).name)
        return real_load(path, **kwargs)

    monkeypatch.setattr(analyze_module, "load_trace_file", counted)
    result = analyze(tmp_path)
    assert loads == ["part4.json.gz"]  # the lowest rank, once
    assert result.source["ranks"] == [4, 5, 6, 7]
    # the same files under ranks 0-3: the same findings and the same per-rank figures
    monkeypatch.setattr(analyze_module, "load_trace_file", real_load)
    shipped = analyze(ranks_0_to_3[0].parent)
    assert [f.rule for f in result.findings] == [f.rule for f in shipped.findings]
    table = pl.DataFrame(result.summary["ranks"]["table"]).drop("rank")
    assert_close(table, pl.DataFrame(shipped.summary["ranks"]["table"]).drop("rank"))


def test_the_pool_and_the_sequential_path_agree(ranks_0_to_3):
    pooled = analyze(ranks_0_to_3[0].parent)
    traces, _ = load_trace_files(ranks_0_to_3)
    names = tuple(map(str, ranks_0_to_3))
    sequential = analyze_loaded(LoadedInput(kind="ranks", path="x", traces=traces, files=names))
    assert_close(
        pl.DataFrame(pooled.summary["ranks"]["table"]),
        pl.DataFrame(sequential.summary["ranks"]["table"]),
    )
    assert pooled.summary["comm_ranks"] == sequential.summary["comm_ranks"]
    assert [(f.rule, f.severity, f.title) for f in pooled.findings] == [
        (f.rule, f.severity, f.title) for f in sequential.findings
    ]
    assert [f.rank for f in pooled.rank_facts] == [0, 1, 2, 3]
