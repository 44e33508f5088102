"""load_trace_file / load: the event table, metadata, ranks, folders and run folders."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest

from diagnostics.errors import InputError
from diagnostics.runs import RunWriter
from diagnostics.trace.loader import load, load_trace_file, rank_from_name
from diagnostics.trace.schema import EVENT_SCHEMA, FLOW_SCHEMA, Category
from tests.diagnostics.trace.helpers import (
    cpu_op,
    kernel,
    runtime,
    small_events,
    trace_doc,
    write_json,
)


def test_event_table_has_exactly_the_schema_sorted_by_ts(tmp_path):
    events = list(reversed(small_events()))  # file order is not time order
    trace = load_trace_file(write_json(tmp_path / "t.json", trace_doc(events)))
    assert trace.events.schema == pl.Schema(EVENT_SCHEMA)
    assert trace.flows.schema == pl.Schema(FLOW_SCHEMA)
    assert trace.events["ts"].to_list() == [0.0, 10.0, 15.0, 25.0]
    assert trace.events["name"].to_list() == [
        "ProfilerStep#1",
        "aten::mm",
        "cudaLaunchKernel",
        "volta_sgemm_128x64_nn",
    ]
    gpu = trace.events.row(3, named=True)
    assert (gpu["device"], gpu["stream"], gpu["correlation"], gpu["external_id"]) == (0, 7, 1, 5)
    assert trace.metadata.process_names == {100: "python"}
    assert trace.metadata.thread_names == {(100, 100): "main"}
    assert (trace.metadata.event_count, trace.metadata.flow_count) == (4, 2)


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("Operator", Category.CPU_OP),
        ("cpu_op", Category.CPU_OP),
        ("Runtime", Category.CUDA_RUNTIME),
        ("cuda_runtime", Category.CUDA_RUNTIME),
        ("Kernel", Category.KERNEL),
        ("Memcpy", Category.GPU_MEMCPY),
        ("gpu_memcpy", Category.GPU_MEMCPY),
        ("Memset", Category.GPU_MEMSET),
        (" USER_ANNOTATION ", Category.USER_ANNOTATION),
        ("gpu_user_annotation", Category.GPU_USER_ANNOTATION),
        ("python_function", Category.PYTHON_FUNCTION),
        ("cuda_sync", Category.CUDA_SYNC),
        ("Trace", Category.TRACE),
        ("something_new", Category.OTHER),
        (None, Category.OTHER),
    ],
)
def test_categories_are_normalised_across_kineto_versions(tmp_path, raw, normalised):
    event = cpu_op("x", 1.0, 1.0)
    event["cat"] = raw
    trace = load_trace_file(write_json(tmp_path / "t.json", [event]))
    assert trace.events["cat"].to_list() == [str(normalised)]


def test_memory_events_are_memory_whatever_their_category(tmp_path):
    old = {  # PyTorch 1.9: no cat, "Bytes" only
        "ph": "i",
        "s": "t",
        "name": "[memory]",
        "pid": 1,
        "tid": 1,
        "ts": 5,
        "args": {"Device Type": 1, "Device Id": 0, "Bytes": 512},
    }
    new = {
        **old,
        "cat": "cpu_instant_event",
        "ts": 6,
        "args": {
            "Device Type": 1,
            "Device Id": 0,
            "Bytes": -512,
            "Total Allocated": 1024,
            "Total Reserved": 2048,
        },
    }
    events = load_trace_file(write_json(tmp_path / "t.json", [old, new])).events
    assert events["cat"].to_list() == ["memory", "memory"]
    assert events["bytes"].to_list() == [512, -512]
    assert events["total_allocated"].to_list() == [None, 1024]
    assert events["total_reserved"].to_list() == [None, 2048]
    assert events["memory_device_type"].to_list() == [1, 1]
    assert events["dur"].to_list() == [None, None]


def test_pytorch_1_9_spellings_fold_into_the_same_columns(tmp_path):
    gpu = {
        "ph": "X",
        "cat": "Memcpy",
        "name": "Memcpy HtoD (Pageable -> Device)",
        "pid": 0,
        "tid": "stream 7",
        "ts": 10,
        "dur": 20,
        "args": {"device": 0, "stream": 7, "correlation": 9, "external id": 3, "bytes": 4096},
    }
    host = {**cpu_op("aten::copy_", 5, 30, cat="Operator"), "tid": "25738"}
    events = load_trace_file(write_json(tmp_path / "t.json", [gpu, host])).events
    copy = events.filter(pl.col("cat") == "gpu_memcpy").row(0, named=True)
    assert (copy["tid"], copy["external_id"], copy["bytes"]) == (7, 3, 4096)
    assert events.filter(pl.col("cat") == "cpu_op")["tid"].to_list() == [25738]


def test_nanosecond_float_timestamps_stay_floats(tmp_path):
    event = cpu_op("x", 1712195495519695.8, 63.813)
    events = load_trace_file(write_json(tmp_path / "t.json", [event])).events
    assert events["ts"].dtype == pl.Float64
    assert events["dur"].to_list() == [63.813]
    # float64 keeps a quarter of a microsecond at this magnitude (2**50 < ts < 2**51)
    assert events["ts"].item() == pytest.approx(1712195495519695.8, abs=0.25)


def test_malformed_events_among_good_ones_give_a_warning_with_counts(tmp_path):
    events = [
        kernel(1.0, 2.0),
        {**kernel(3.0, 1.0), "dur": -4.0},
        {**kernel(5.0, 1.0), "dur": -1.0},
        {k: v for k, v in kernel(7.0, 1.0).items() if k != "dur"},
        {k: v for k, v in kernel(8.0, 1.0).items() if k != "ts"},
        {**kernel(9.0, 1.0), "ts": "later"},
        runtime(10.0, 1.0),
    ]
    trace = load_trace_file(write_json(tmp_path / "t.json", trace_doc(events)))
    assert trace.events["ts"].to_list() == [1.0, 10.0]
    assert trace.metadata.skipped_events == 5
    (warning,) = trace.metadata.warnings
    assert warning.startswith(f"{tmp_path / 't.json'}: skipped 5 of 7 events as malformed")
    assert "2 negative dur" in warning and "1 complete event (ph X) without dur" in warning
    assert "1 no ts" in warning and "1 ts is str, expected float" in warning


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([], "traceEvents is empty"),
        ([{**kernel(1.0, 1.0), "dur": -1.0}], "all 1 event are malformed (1 negative dur)"),
        ([{"ph": "X", "name": "a"}, {"ph": "X", "ts": 1}], "all 2 events are malformed"),
        (["x", 1, None], "all 3 events are malformed (3 not a JSON object)"),
        ([{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "p"}}], "no complete"),
        ([{"ph": "X", "ts": {"a": 1}, "dur": 1, "name": "a"}], "1 ts is object, expected float"),
    ],
)
def test_nothing_usable_is_an_input_error(tmp_path, events, message):
    path = write_json(tmp_path / "t.json", trace_doc(events))
    with pytest.raises(InputError, match=rf"^{path}: .*") as caught:
        load_trace_file(path)
    assert message in str(caught.value)


def test_phases_the_table_does_not_hold_are_ignored_with_a_note(tmp_path):
    events = [
        kernel(1.0, 1.0),
        {"ph": "B", "name": "a", "pid": 1, "tid": 1, "ts": 1},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 2},
        {"ph": "C", "name": "mem", "pid": 1, "ts": 3, "args": {"v": 1}},
    ]
    trace = load_trace_file(write_json(tmp_path / "t.json", events))
    # the B/E pair is one range now (diagnostics.trace.begin_end); only the counter is left
    assert trace.events.height == 2
    assert any(
        "ignored events of phases" in note and "(1 'C')" in note for note in trace.metadata.notes
    )


def test_rank_from_distributed_info_then_file_name_then_zero(tmp_path):
    doc = trace_doc(small_events(), distributedInfo={"rank": 3, "world_size": 8})
    by_info = load_trace_file(write_json(tmp_path / "rank5.json", doc))
    assert (by_info.rank, by_info.metadata.rank_source) == (3, "distributedInfo")
    assert by_info.events["rank"].unique().to_list() == [3]
    by_name = load_trace_file(write_json(tmp_path / "job_rank-5.json", trace_doc(small_events())))
    assert (by_name.rank, by_name.metadata.rank_source) == (5, "file name")
    default = load_trace_file(write_json(tmp_path / "trace.json", trace_doc(small_events())))
    assert (default.rank, default.metadata.rank_source) == (0, "default")


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("rank-0.Apr_03.pt.trace.json.gz", 0),
        ("trace_8_rank_1.json", 1),
        ("RANK12.json", 12),
        ("worker3.1623143089861.pt.trace.json.gz", 3),
        ("host_1234.1623143089861.pt.trace.json", None),
        ("resnet50_num_workers_4.pt.trace.json.gz", None),  # "workers_4" is not a rank
    ],
)
def test_rank_from_name(name, rank):
    assert rank_from_name(name) == rank


def test_metadata_from_the_top_level_object(tmp_path):
    props = [{"id": 0, "name": "Tesla V100", "totalGlobalMem": 34089730048, "computeMajor": 7}]
    doc = trace_doc(
        small_events(),
        deviceProperties=props,
        distributedInfo={"backend": "nccl", "rank": 1, "world_size": 2},
        baseTimeNanoseconds=1700000000000000000,
        displayTimeUnit="ns",
        traceName="/tmp/x.json",
        INFO=["line"] * 100,  # a long log list is not kept in extra
    )
    meta = load_trace_file(write_json(tmp_path / "t.json.gz", doc, gz=True)).metadata
    assert meta.device_properties == tuple(props)
    assert meta.distributed_info == {"backend": "nccl", "rank": 1, "world_size": 2}
    assert (meta.schema_version, meta.base_time_ns, meta.display_time_unit) == (
        1,
        1700000000000000000,
        "ns",
    )
    assert meta.extra == {"traceName": "/tmp/x.json"}


def test_load_a_folder_of_rank_traces_sorted_by_rank(tmp_path):
    folder = tmp_path / "ranks"
    for rank in (1, 0):
        doc = trace_doc(small_events(), distributedInfo={"rank": rank, "world_size": 2})
        write_json(folder / f"host_{100 + rank}.123.pt.trace.json.gz", doc, gz=True)
    (folder / "notes.txt").write_text("not a trace")
    loaded = load(folder)
    assert loaded.kind == "ranks"
    assert loaded.ranks == (0, 1)
    assert [t.events["rank"].unique().to_list() for t in loaded.traces] == [[0], [1]]
    assert len(loaded.files) == 2


def test_files_without_rank_info_number_by_worker_and_merge_windows(tmp_path):
    folder = tmp_path / "traces"
    # host_1 wrote two profiler windows; host_2 is a second process
    write_json(folder / "host_1.100.pt.trace.json", trace_doc(small_events()))
    later = [{**e, "ts": e["ts"] + 1000} if "ts" in e else e for e in small_events()]
    write_json(folder / "host_1.200.pt.trace.json", trace_doc(later))
    write_json(folder / "host_2.100.pt.trace.json", trace_doc(small_events()))
    loaded = load(folder)
    assert loaded.ranks == (0, 1)
    first = loaded.traces[0]
    assert first.events.height == 2 * 4  # both windows of host_1, 4 rows each
    assert first.events["ts"].is_sorted()
    assert len(first.metadata.files) == 2
    assert any("host_1 -> 0, host_2 -> 1" in note for note in loaded.notes)


def test_a_folder_without_traces_is_an_input_error(tmp_path):
    (tmp_path / "readme.md").write_text("hi")
    with pytest.raises(InputError, match="holds no trace files"):
        load(tmp_path)


def _run_folder(tmp_path, *, with_trace: bool):
    writer = RunWriter.create(
        tmp_path / "runs",
        config={"scenario": "healthy", "device": "cpu"},
        environment={"device": "cpu", "pytorch_version": "2.9.0", "cpu_count": 2},
        run_id="r1",
        total_steps=3,
    )
    for step in (1, 2, 3):
        writer.append_step({"step": step, "step_time_ms": 10.0 * step, "data_wait_ms": 1.0})
    if with_trace:
        write_json(writer.path / "trace" / "host_1.1.pt.trace.json.gz", trace_doc(small_events()))
    writer.finalise("completed")
    return writer.path


def test_run_folder_with_a_trace(tmp_path):
    loaded = load(_run_folder(tmp_path, with_trace=True))
    assert loaded.kind == "run"
    assert loaded.run is not None and loaded.run.steps.height == 3
    assert loaded.ranks == (0,)
    assert loaded.traces[0].events.height == 4


def test_run_folder_without_a_trace_loads_its_records_only(tmp_path):
    loaded = load(_run_folder(tmp_path, with_trace=False))
    assert loaded.kind == "run" and loaded.traces == ()
    assert loaded.run is not None and loaded.run.steps["step_time_ms"].to_list() == [
        10.0,
        20.0,
        30.0,
    ]


def test_unreadable_run_folder_is_an_input_error(tmp_path):
    path = _run_folder(tmp_path, with_trace=False)
    (path / "run.json").write_text("{broken")
    with pytest.raises(InputError, match=rf"^{path}: is not a readable run folder"):
        load(path)


def test_run_trace_still_being_written_is_left_out_with_a_warning(tmp_path):
    path = _run_folder(tmp_path, with_trace=True)
    whole = gzip.compress(json.dumps(trace_doc(small_events())).encode())
    partial = path / "trace" / "host_1.2.pt.trace.json.gz"
    partial.write_bytes(whole[: len(whole) // 2])  # the trainer is mid-write
    loaded = load(path)
    assert loaded.run is not None and loaded.ranks == (0,)
    assert loaded.traces[0].events.height == 4  # the complete window only
    (warning,) = loaded.warnings
    assert warning == f"trace left out: {partial}: is a truncated gzip file (the stream ends early)"


def test_a_broken_file_in_a_rank_folder_is_an_error(tmp_path):
    folder = tmp_path / "ranks"
    write_json(folder / "rank0.json", trace_doc(small_events()))
    (folder / "rank1.json").write_text("{oops")
    with pytest.raises(InputError, match=r"rank1\.json: is not valid JSON"):
        load(folder)


def test_a_table_sorted_whole_equals_one_sorted_column_by_column(monkeypatch):
    # below SORT_WHOLE_MAX_ROWS the table is sorted in one go; above, column by column (to
    # bound memory): the same rows in the same order either way, equal times included
    from pathlib import Path

    from polars.testing import assert_frame_equal

    from diagnostics.trace import normalise

    trace = (
        Path(__file__).resolve().parents[4] / "shared" / "traces" / "hta_a100_rank3_of_8.json.gz"
    )
    whole = load_trace_file(trace, parallel_decode=False)
    monkeypatch.setattr(normalise, "SORT_WHOLE_MAX_ROWS", 0)
    by_column = load_trace_file(trace, parallel_decode=False)
    assert_frame_equal(whole.events, by_column.events)
    assert whole.events["ts"].is_sorted()
    assert whole.events.height > 70_000
    assert whole.events.select(pl.struct("ts").is_duplicated().any()).item()  # ties exist


def test_chunks_normalised_together_or_one_by_one_give_the_same_table(monkeypatch):
    # consecutive chunks decoded here are normalised at once (NORMALISE_BATCH_ROWS): the
    # same table as one by one, equal times in file order
    from pathlib import Path

    from polars.testing import assert_frame_equal

    from diagnostics.trace import normalise

    trace = (
        Path(__file__).resolve().parents[4] / "shared" / "traces" / "hta_a100_rank3_of_8.json.gz"
    )
    together = load_trace_file(trace, parallel_decode=False, chunk_bytes=256 << 10)
    monkeypatch.setattr(normalise, "NORMALISE_BATCH_ROWS", 1)
    one_by_one = load_trace_file(trace, parallel_decode=False, chunk_bytes=256 << 10)
    assert_frame_equal(together.events, one_by_one.events)
    assert_frame_equal(together.flows, one_by_one.flows)
    assert together.metadata == one_by_one.metadata
    assert together.events.select(pl.struct("ts").is_duplicated().any()).item()  # ties exist


def test_a_chunk_normalised_elsewhere_keeps_its_place_among_chunks_waiting_here():
    # rows at one time stay in file order: chunks decoded here wait to be normalised
    # together, so a chunk the helper normalised must not overtake them
    from diagnostics.trace.decode import decode_trace
    from diagnostics.trace.normalise import TableBuilder, normalise_chunk

    def raw(*names):
        events = [
            {"ph": "X", "cat": "cpu_op", "name": n, "ts": 5, "dur": 1, "pid": 1, "tid": 1}
            for n in names
        ]
        return decode_trace(iter([json.dumps({"traceEvents": events}).encode()]), "t.json").frame

    builder = TableBuilder()
    builder.add(raw("a", "b"), None)
    builder.add_normalised(normalise_chunk(raw("c"), None))
    builder.add(raw("d"), None)
    assert builder.rows == 4
    table = builder.finish(rank=3)
    assert table.events["name"].to_list() == ["a", "b", "c", "d"]
    assert table.events["rank"].to_list() == [3] * 4


@pytest.mark.parametrize("sort_whole_max_rows", [10**9, 0])
def test_all_null_columns_hold_no_value_per_row_and_partial_ones_keep_their_values(
    tmp_path, monkeypatch, sort_whole_max_rows
):
    # Most args columns are null on every row of a trace. They are held as one null each
    # (a polars literal column), not 8 or 16 bytes a row; a column null in most chunks but
    # set in one keeps that chunk's values, at their rows, after the sort. Both sort paths.
    from diagnostics.trace import normalise

    monkeypatch.setattr(normalise, "SORT_WHOLE_MAX_ROWS", sort_whole_max_rows)
    n_ops = 20_000
    events = [cpu_op("aten::add", float(i), 0.5) for i in range(n_ops)]
    memory = {
        "ph": "i",
        "cat": "cpu_instant_event",
        "name": "[memory]",
        "pid": 100,
        "tid": 100,
        "ts": n_ops + 5.0,
        "s": "t",
        "args": {"Total Allocated": 4096, "Total Reserved": 8192, "Bytes": 512},
    }
    # reversed: the one [memory] instant is decoded in the first chunk, sorted to the end
    path = write_json(tmp_path / "t.json", trace_doc([memory, *reversed(events)]))
    trace = load_trace_file(path, chunk_bytes=64 * 1024, parallel_decode=False)

    table = trace.events
    assert table.schema == pl.Schema(EVENT_SCHEMA)
    assert table.height == n_ops + 1
    assert table["ts"].is_sorted()
    last = table.row(table.height - 1, named=True)
    assert (last["total_allocated"], last["total_reserved"], last["bytes"]) == (4096, 8192, 512)
    assert table["total_allocated"].null_count() == n_ops

    never_set = ["input_shapes", "collective_name", "in_msg_nelems", "process_group_ranks"]
    # a String column of nulls costs a 16-byte view a row (320 kB here), an Int64 one 8
    # (measured first: reading a column out as a Series lays it out, in polars)
    assert table.select(never_set).estimated_size() < 1_000
    assert table.select("total_allocated").estimated_size() >= 8 * table.height
    assert all(table[name].null_count() == table.height for name in never_set)


def _text_bytes(column: pl.Series) -> int:
    """Bytes of text behind a String column's views (each distinct buffer counted once)."""
    buffers = column.to_arrow(compat_level=pl.CompatLevel.newest()).buffers()[2:]
    return sum(b.size for b in {b.address: b for b in buffers if b is not None}.values())


def test_a_table_sorted_by_column_stores_each_distinct_name_once(tmp_path, monkeypatch):
    # Above SORT_WHOLE_MAX_ROWS an operator name longer than the 12 bytes a view holds is
    # stored once, not once a row; the values and their order are those of the whole sort.
    from polars.testing import assert_frame_equal

    from diagnostics.trace import normalise

    names = [f"aten::convolution_backward_{i % 5}" for i in range(20_000)]
    events = [cpu_op(name, float(20_000 - i), 0.5) for i, name in enumerate(names)]
    path = write_json(tmp_path / "t.json", trace_doc(events))
    whole = load_trace_file(path, chunk_bytes=64 * 1024, parallel_decode=False)
    monkeypatch.setattr(normalise, "SORT_WHOLE_MAX_ROWS", 0)
    by_column = load_trace_file(path, chunk_bytes=64 * 1024, parallel_decode=False)

    assert_frame_equal(whole.events, by_column.events)
    assert by_column.events["ts"].is_sorted()
    assert _text_bytes(whole.events["name"]) >= sum(map(len, names))  # a copy a row
    assert _text_bytes(by_column.events["name"]) < 1_000  # five names, once each


def test_an_analysis_load_leaves_the_flows_out_and_counts_them(tmp_path):
    # only drill-downs read flow events: the analysis loads without them (a third of a
    # modern trace's events), the count stays, and the event table is the same
    from polars.testing import assert_frame_equal

    path = write_json(tmp_path / "t.json", trace_doc(small_events()))
    kept = load_trace_file(path)
    left_out = load_trace_file(path, with_flows=False)
    assert kept.flows.height == 2
    assert left_out.flows.height == 0 and left_out.flows.schema == pl.Schema(FLOW_SCHEMA)
    assert left_out.metadata.flow_count == kept.metadata.flow_count == 2
    assert_frame_equal(left_out.events, kept.events)
    assert load(path, with_flows=False).traces[0].flows.height == 0
    assert load(path).traces[0].flows.height == 2
