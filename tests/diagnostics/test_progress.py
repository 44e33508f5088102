"""Progress of a long analysis: counted per rank file in the pool, per MB read and per fact
computed for one large trace, printed on stderr by the CLI, passed from the bounded child to
its parent, and reported by an upload read in one pass."""

from __future__ import annotations

import io
import json

import pytest

import diagnostics.analyze as analyze_module
import diagnostics.facts.assemble as assemble_module
import diagnostics.progress as progress_module
from diagnostics.__main__ import main
from diagnostics.analyze import analyze
from diagnostics.isolated import analyze_isolated
from diagnostics.progress import (
    MB,
    ProgressFile,
    ReadProgress,
    StderrProgress,
    WorkDone,
    read_progress,
)
from diagnostics.upload_analysis import analyse_upload_files
from tests.diagnostics.trace.helpers import SHARED_TRACES, write_rank_copies

# a real trace of 51 MB of JSON, 2.9 MB as stored
LARGE_REAL = SHARED_TRACES / "hta_v100_rank1_of_2_large.json.gz"


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("four")
    write_rank_copies(folder, [0, 1, 2, 3])
    return folder


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_text_says_how_many_of_how_many_and_the_time():
    work = WorkDone("rank files analysed", 16, 64, 5.2)
    assert work.text() == "16 of 64 rank files analysed (25 %, 5 s)"
    assert work.fraction == 0.25
    assert WorkDone("files read", 0, 0, 0.0).fraction == 1.0  # nothing to do is done


def test_off_a_terminal_quick_work_prints_nothing_and_long_work_a_line_now_and_then():
    clock, out = Clock(), io.StringIO()
    shown = StderrProgress(out, clock=clock)
    shown(WorkDone("rank files analysed", 1, 64, 1.0))
    clock.now += progress_module.SHOWN_AFTER_S - 0.1
    shown(WorkDone("rank files analysed", 2, 64, 1.9))
    assert out.getvalue() == ""  # under SHOWN_AFTER_S: quick work says nothing
    clock.now += 0.2
    shown(WorkDone("rank files analysed", 3, 64, 2.1))
    clock.now += 1.0
    shown(WorkDone("rank files analysed", 4, 64, 3.1))  # within LINE_EVERY_S: not printed
    clock.now += progress_module.LINE_EVERY_S
    shown(WorkDone("rank files analysed", 20, 64, 8.1))
    clock.now += 0.5
    shown(WorkDone("rank files analysed", 64, 64, 8.6))  # the last one always
    shown.close()
    assert out.getvalue().splitlines() == [
        "3 of 64 rank files analysed (5 %, 2 s)",
        "20 of 64 rank files analysed (31 %, 8 s)",
        "64 of 64 rank files analysed (100 %, 9 s)",
    ]


def test_on_a_terminal_one_line_is_rewritten_and_cleared_at_the_end():
    clock, out = Clock(), Terminal()
    shown = StderrProgress(out, clock=clock)
    clock.now += progress_module.SHOWN_AFTER_S
    shown(WorkDone("rank files analysed", 1, 4, 2.0))
    shown(WorkDone("rank files analysed", 2, 4, 2.5))
    shown.close()
    assert out.getvalue() == (
        "\r\033[K1 of 4 rank files analysed (25 %, 2 s)"
        "\r\033[K2 of 4 rank files analysed (50 %, 2 s)"
        "\r\033[K"
    )
    assert "\n" not in out.getvalue()  # nothing left above the answer or an error line


def test_the_progress_file_holds_the_latest_report_and_anything_else_reads_as_none(tmp_path):
    path = tmp_path / "progress.json"
    assert read_progress(path) is None  # nothing written yet
    write = ProgressFile(path)
    write(WorkDone("files read", 1, 3, 0.5))
    write(WorkDone("files read", 2, 3, 1.0))
    assert read_progress(path) == WorkDone("files read", 2, 3, 1.0)
    for garbage in ("", "[1, 2]", '{"what": "x"}', json.dumps({"what": "x", "done": "a"})):
        path.write_text(garbage)
        assert read_progress(path) is None


def test_the_cli_prints_a_long_analysiss_progress_on_stderr(four_ranks, monkeypatch, capsys):
    monkeypatch.setattr(progress_module, "SHOWN_AFTER_S", 0.0)
    assert main(["analyze", str(four_ranks)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["source"]["ranks"] == [0, 1, 2, 3]
    lines = captured.err.splitlines()
    assert lines[0] == "0 of 4 rank files analysed (0 %, 0 s)"
    assert lines[-1].startswith("4 of 4 rank files analysed (100 %, ")


def test_the_bounded_childs_progress_reaches_its_parent(four_ranks):
    reports: list[WorkDone] = []
    result = analyze_isolated(four_ranks, progress=reports.append)
    assert result.source["ranks"] == [0, 1, 2, 3]
    assert reports, "no progress came back from the child"
    done = [r.done for r in reports]
    assert done == sorted(done) and reports[-1] == WorkDone(
        "rank files analysed", 4, 4, reports[-1].elapsed_s
    )


def test_an_upload_of_four_ranks_is_read_once_in_the_pool_and_reports_each_file(
    four_ranks, tmp_path
):
    # one pass: each worker makes its file's identity, stored drill-down and rank digest, and
    # the ranks are analysed from those (no "files read" pass before the pool's)
    reports: list[WorkDone] = []
    files = sorted(four_ranks.iterdir())
    upload = analyse_upload_files(
        files,
        display_names=[f.name for f in files],
        mode=None,
        store=tmp_path,
        progress=reports.append,
    )
    assert [(r.what, r.done) for r in reports] == [("rank files analysed", n) for n in range(5)]
    assert upload.mode == "ranks" and not upload.mismatches
    assert upload.identities["rank"].to_list() == [0, 1, 2, 3]
    (result,) = upload.results
    assert result.result.source["ranks"] == [0, 1, 2, 3]
    assert [d.label for d in result.drilldowns] == [f.name for f in files]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"file-{i}.{part}" for i in range(4) for part in ("events", "flows")
    ]


def _file_of(path, size: int):
    path.write_bytes(b"x" * size)
    return path


def _blocks(size: int, read: list[int], block: int = 256 * 1024):
    """A reader's blocks of a ``size``-byte file, counting into ``read`` as it goes."""
    while read[0] < size:
        n = min(block, size - read[0])
        read[0] += n
        yield b"x" * n


def test_a_read_reports_the_mb_of_its_files_read_until_all_of_them(tmp_path):
    sizes = (3 * MB + MB // 2, MB)
    paths = [_file_of(tmp_path / f"{i}.json", n) for i, n in enumerate(sizes)]
    reports: list[WorkDone] = []
    meter = ReadProgress(paths, reports.append)
    meter.start()
    for path, size in zip(paths, sizes, strict=True):
        read = [0]
        assert b"".join(meter.following(path, _blocks(size, read), lambda r=read: r[0])) == (
            b"x" * size
        )
    assert {r.what for r in reports} == {"MB of 2 files read"}
    assert {r.total for r in reports} == {5}  # 4.5 MB, rounded up
    done = [r.done for r in reports]
    assert done[0] == 0 and done[-1] == 5
    assert done == sorted(done) and len(done) == len(set(done))  # each figure said once
    assert 3 in done and 4 in done  # on the way, not only at the ends


def test_a_file_given_up_half_read_counts_as_read_so_the_read_still_ends_at_its_total(
    tmp_path,
):
    sizes = (2 * MB, 2 * MB)
    paths = [_file_of(tmp_path / f"{i}.json", n) for i, n in enumerate(sizes)]
    reports: list[WorkDone] = []
    meter = ReadProgress(paths, reports.append)
    read = [0]
    first = meter.following(paths[0], _blocks(sizes[0], read), lambda: read[0])
    next(first)
    first.close()  # left out after its first block (unreadable, or over a budget)
    read = [0]
    list(meter.following(paths[1], _blocks(sizes[1], read), lambda: read[0]))
    assert reports[-1].done == reports[-1].total == 4


def test_one_large_trace_reports_its_read_then_each_fact(monkeypatch):
    monkeypatch.setattr(analyze_module, "LONG_INPUT_BYTES", 0)  # as if it were one
    reports: list[WorkDone] = []
    result = analyze(LARGE_REAL, progress=reports.append)
    assert result.findings is not None
    read = [r for r in reports if r.what == "MB of the trace read"]
    facts = [r for r in reports if r.what == "facts computed"]
    assert reports == read + facts  # the read, then the facts
    assert read[0].done == 0 and read[-1].done == read[-1].total == 3  # 2.9 MB as stored
    assert [r.done for r in facts] == list(range(17))
    assert {r.total for r in facts} == {16}


def test_the_facts_phase_is_said_before_the_index_is_built(monkeypatch):
    # the index takes a second of a 1 GB trace: the read's "93 of 93 MB" must not stay shown
    monkeypatch.setattr(analyze_module, "LONG_INPUT_BYTES", 0)
    reports: list[WorkDone] = []
    seen_by_the_index: list[tuple[str, int]] = []
    real_build_index = assemble_module.build_index

    def build_index(events):
        seen_by_the_index.extend((r.what, r.done) for r in reports)
        return real_build_index(events)

    monkeypatch.setattr(assemble_module, "build_index", build_index)
    analyze(LARGE_REAL, progress=reports.append)
    assert seen_by_the_index[-2:] == [("MB of the trace read", 3), ("facts computed", 0)]


def test_a_trace_under_the_long_input_size_reports_nothing_so_the_cli_stays_quiet(capsys):
    assert LARGE_REAL.stat().st_size < progress_module.LONG_INPUT_BYTES
    reports: list[WorkDone] = []
    analyze(LARGE_REAL, progress=reports.append)
    assert reports == []


def test_the_cli_prints_a_large_traces_progress_on_stderr(monkeypatch, capsys):
    monkeypatch.setattr(progress_module, "SHOWN_AFTER_S", 0.0)
    monkeypatch.setattr(analyze_module, "LONG_INPUT_BYTES", 0)
    assert main(["analyze", str(LARGE_REAL)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["findings"] is not None
    lines = captured.err.splitlines()
    assert lines[0] == "0 of 3 MB of the trace read (0 %, 0 s)"
    assert any(line.startswith("3 of 3 MB of the trace read (100 %, ") for line in lines)
    assert lines[-1].startswith("16 of 16 facts computed (100 %, ")


def test_a_single_file_upload_reports_its_read_then_each_fact(tmp_path):
    reports: list[WorkDone] = []
    upload = analyse_upload_files(
        [LARGE_REAL],
        display_names=[LARGE_REAL.name],
        mode=None,
        store=tmp_path,
        progress=reports.append,
    )
    assert len(upload.results) == 1
    assert [(r.what, r.done) for r in reports] == [
        *(("MB of the trace read", n) for n in range(4)),
        *(("facts computed", n) for n in range(17)),
    ]
