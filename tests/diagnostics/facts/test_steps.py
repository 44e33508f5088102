from diagnostics.facts import compute_facts
from diagnostics.facts.linking import build_index
from diagnostics.facts.steps import find_steps
from diagnostics.trace.schema import empty_event_table
from tests.diagnostics.facts.trace_fixture import events_of, gpu, op, runtime, step


def steps_of(*rows):
    events = events_of(*rows)
    return find_steps(events, build_index(events))


def test_step_end_extends_to_the_end_of_the_gpu_work_it_launched():
    found = steps_of(
        step(1, 0, 100),
        runtime("cudaLaunchKernel", 10, 5, corr=1),
        gpu("k1", 20, 150, corr=1),  # launched in step 1, ends at 170
        step(2, 100, 100),
        runtime("cudaLaunchKernel", 110, 5, corr=2),
        gpu("k2", 170, 50, corr=2),  # queued behind k1, ends at 220
    )
    rows = found.frame.select("step", "start_us", "end_us", "dur_us", "gpu_events").rows()
    # Step 1 ends when its kernel does (170); step 2 starts there (after its host start
    # 100) and ends at its kernel's end, 220.
    assert rows == [(1, 0.0, 170.0, 170.0 - 0.0, 1), (2, 170.0, 220.0, 220.0 - 170.0, 1)]
    assert not found.inferred


def test_first_step_starts_after_gpu_work_launched_before_it():
    found = steps_of(
        runtime("cudaLaunchKernel", 0, 5, corr=9),
        gpu("warmup", 10, 40, corr=9),  # launched before any step, ends at 50
        step(1, 20, 100),
        runtime("cudaLaunchKernel", 30, 5, corr=1),
        gpu("k1", 60, 10, corr=1),
    )
    # Step 0's device work starts at 60; unmatched GPU work ending before that (at 50)
    # moves the step's start from its host start 20 to 50. Its end is its host end, 120.
    assert found.frame.select("start_us", "end_us").rows() == [(50.0, 120.0)]


def test_calls_straddling_a_step_boundary_belong_to_no_step():
    found = steps_of(
        step(1, 0, 100),
        runtime("cudaLaunchKernel", 95, 10, corr=1),  # ends at 105, past the step
        gpu("k", 300, 10, corr=1),
        step(2, 100, 100),
        runtime("cudaLaunchKernel", 150, 5, corr=2),
        gpu("k2", 160, 10, corr=2),
    )
    assert found.frame["gpu_events"].to_list() == [0, 1]
    # Step 1 launched nothing so it keeps its host range; step 2's kernel ends inside it.
    assert found.frame.select("start_us", "end_us").rows() == [(0.0, 100.0), (100.0, 200.0)]


def test_last_step_dropped_when_it_launched_much_less_than_the_one_before():
    rows = [step(1, 0, 100), step(2, 100, 100)]
    corr = 0
    for i in range(5):  # step 1 launches 5 kernels
        corr += 1
        rows += [runtime("cudaLaunchKernel", 10 + i, 1, corr), gpu("k", 20 + i, 1, corr)]
    for i in range(3):  # step 2 launches 3: 5 * 0.8 = 4 > 3, so it was cut short
        corr += 1
        rows += [runtime("cudaLaunchKernel", 110 + i, 1, corr), gpu("k", 120 + i, 1, corr)]
    found = steps_of(*rows)
    assert found.frame["step"].to_list() == [1]
    assert any("dropped the last 1 profiler step" in w for w in found.warnings)


def test_cpu_only_steps_keep_their_host_ranges():
    found = steps_of(
        step(3, 0, 50, cat="cpu_op"), step(4, 50, 70, cat="cpu_op"), op("aten::mm", 5, 10)
    )
    # PyTorch 1.9 writes steps as Operator events; no GPU work, so host ranges stand.
    assert found.frame.select("step", "dur_us").rows() == [(3, 50.0), (4, 70.0)]


def test_no_profiler_steps_falls_back_to_the_host_span_and_says_so():
    found = steps_of(op("aten::mm", 10, 30), op("aten::add", 50, 20))
    assert found.inferred
    # The host span runs from the first op's start (10) to the last op's end (50 + 20).
    assert found.frame.select("step", "start_us", "end_us").rows() == [(0, 10.0, 70.0)]
    assert found.warnings and "no ProfilerStep#N" in found.warnings[0]


def test_empty_event_table_has_no_steps_and_no_facts():
    events = empty_event_table()  # the loader refuses empty files; the facts still cope
    found = find_steps(events, build_index(events))
    assert found.frame.height == 0
    assert found.span is None
    facts = compute_facts(events, None)
    assert facts.device == "cpu"
    assert facts.breakdown.height == facts.gpu.height == facts.operators.height == 0


def test_without_host_steps_the_gpu_side_profiler_steps_are_the_steps():
    gpu_step = step(7, 100, 50, cat="gpu_user_annotation")
    gpu_step["pid"], gpu_step["tid"] = 0, 7
    found = steps_of(
        op("aten::mm", 0, 300),
        runtime("cudaLaunchKernel", 10, 5, corr=1),
        gpu("before", 40, 20, corr=1),  # ends at 60, before the GPU-side step
        gpu_step,  # GPU-side ProfilerStep#7: 100 to 150 on the device clock
        gpu("k", 110, 30, corr=None),
    )
    assert found.inferred and found.on_device_clock
    # The GPU-side range is the step as written (TraceLens's window), one GPU event in it.
    assert found.frame.select("step", "start_us", "end_us", "gpu_events").rows() == [
        (7, 100.0, 150.0, 1)
    ]
    assert "1 GPU-side ProfilerStep range(s)" in found.warnings[0]


def test_without_any_steps_a_gpu_trace_is_measured_first_to_last_gpu_activity():
    found = steps_of(
        op("aten::mm", 0, 500),  # the host span, 0 to 500, is far longer than the GPU's
        runtime("cudaLaunchKernel", 10, 5, corr=1),
        gpu("k1", 100, 20, corr=1),
        runtime("cudaLaunchKernel", 20, 5, corr=2),
        gpu("k2", 200, 40, corr=2),
    )
    assert found.inferred and found.on_device_clock
    # First GPU start (100) to last GPU end (200 + 40), as TraceLens measures such traces.
    assert found.frame.select("start_us", "end_us", "gpu_events").rows() == [(100.0, 240.0, 2)]
    assert "first to last GPU activity is treated as one step" in found.warnings[0]


def test_gpu_work_of_an_inferred_gpu_window_counts_whatever_ran_in_it():
    events = events_of(
        op("aten::mm", 0, 500),
        runtime("cudaLaunchKernel", 10, 5, corr=1),
        gpu("k1", 100, 20, corr=1),
        gpu("queued_before_recording", 130, 10, corr=99),  # no launching call in the trace
        gpu("k2", 200, 40, corr=None),
    )
    facts = compute_facts(events, None)
    # busy = 20 + 10 + 40 = 70 of the 140 µs window: every event that ran in it, linked or not.
    assert facts.gpu.select("busy_us", "span_us").rows() == [(70.0, 140.0)]
