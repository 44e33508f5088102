"""Where the host syncs, from the trace's Python stacks (facts/sync_sites.py, and the
host-device-sync rule's sync_sites evidence).

Real data, surveyed with json.load over every shared trace and H200 run: only the TraceLens
H100 and MI300X Qwen inference traces and the B200 vLLM trace carry python_function events
and syncs together; the H200 runs of this project's trainer carry no python_function at all.
The H100 trace's ProfilerStep#6 holds (by hand, json.load) one aten::item (29.76 µs, with
aten::_local_scalar_dense and a 7.69 µs cudaStreamSynchronize inside it) under
``moca/library/model_hub/huggingface/model/adapters/text_base_model.py(28): run_on_input``
below transformers/torch frames, and a 2,167 µs cudaDeviceSynchronize under
``torch/cuda/__init__.py(975): synchronize`` called from
``moca/library/profiling/profile.py(34): run_torch_profiler``. The oracle below finds the
enclosing frame by its own interval walk over the json events.

A CPU trace recorded here with with_stack=True of a tiny loop calling ``.item()`` checks
the frame lookup on what this torch writes (on a CPU trace aten::item blocks on nothing, so
it is not a sync and sync_sites is empty there).
"""

from __future__ import annotations

import gzip
import inspect
import json
from pathlib import Path

import polars as pl
import pytest

from diagnostics.facts.assemble import compute_facts
from diagnostics.facts.python_stacks import innermost_user_frame, is_library_path, user_frames
from diagnostics.rules.host_device_sync import NO_STACKS_NOTE, HostDeviceSync, short_path
from diagnostics.thresholds import Thresholds
from diagnostics.trace.loader import load_trace_file

TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
H100 = TRACES / "tracelens_h100_qwen1.5-0.5b_infer_profmem.json.gz"
SYNCS = {
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "aten::item",
    "aten::_local_scalar_dense",
}
# hand-chosen for this trace: the frames that are library code in its stacks
LIBRARY_PREFIXES = ("<", "nn.Module", "torch/", "transformers/", "multiprocessing/", "threading")


def _oracle_sites(raw: list[dict], start_us: float, end_us: float) -> dict[str, tuple[int, float]]:
    """frame name -> (stretches, blocked µs): nested sync calls merged by hand, each named by
    the latest-starting user frame open at its start on its thread."""
    calls = sorted(
        (e for e in raw if e.get("ph") == "X" and e.get("name") in SYNCS),
        key=lambda e: e["ts"],
    )
    stretches: list[list] = []
    for call in calls:
        end = call["ts"] + call["dur"]
        last = stretches[-1] if stretches else None
        if last and last[0] == (call["pid"], call["tid"]) and call["ts"] <= last[2]:
            last[2] = max(last[2], end)
        else:
            stretches.append([(call["pid"], call["tid"]), call["ts"], end])
    frames = [
        e
        for e in raw
        if e.get("cat") == "python_function" and not e["name"].startswith(LIBRARY_PREFIXES)
    ]
    sites: dict[str, tuple[int, float]] = {}
    for thread, begin, end in stretches:
        if not start_us <= begin < end_us:
            continue
        open_frames = [
            f
            for f in frames
            if (f["pid"], f["tid"]) == thread and f["ts"] <= begin < f["ts"] + f["dur"]
        ]
        name = max(open_frames, key=lambda f: f["ts"])["name"]
        count, blocked = sites.get(name, (0, 0.0))
        sites[name] = (count + 1, blocked + end - begin)
    return sites


@pytest.fixture(scope="module")
def h100():
    loaded = load_trace_file(H100)
    return compute_facts(loaded.events, loaded.metadata)


def test_h100_trace_names_each_sync_by_its_innermost_user_frame(h100):
    with gzip.open(H100) as handle:
        raw = json.load(handle)["traceEvents"]
    step = h100.steps.row(0, named=True)  # the step window is steps.py's (tested there)
    expected = _oracle_sites(raw, step["start_us"], step["end_us"])
    sites = h100.sync_sites
    assert sites is not None
    got = {row["frame"]: (row["calls"], row["blocked_us"]) for row in sites.iter_rows(named=True)}
    assert got.keys() == expected.keys()
    for name, (count, blocked) in expected.items():
        assert got[name][0] == count
        assert got[name][1] == pytest.approx(blocked, abs=0.01)
    item = sites.filter(pl.col("function") == "run_on_input").row(0, named=True)
    assert item["op"] == "aten::item"
    assert item["line"] == 28
    assert item["blocked_us"] == pytest.approx(29.76, abs=0.01)  # by hand, above


def test_library_paths_are_not_user_code():
    assert is_library_path("torch/nn/modules/module.py")
    assert is_library_path("transformers/models/qwen2/modeling_qwen2.py")
    assert is_library_path("threading.py")
    assert is_library_path("multiprocessing/process.py")
    assert is_library_path("<built-in function _cuda_synchronize>")
    assert is_library_path("/usr/lib/python3.11/site-packages/tqdm/std.py")
    assert not is_library_path("train.py")
    assert not is_library_path("trainer/loop.py")  # the reference trainer's loop is the user's
    assert not is_library_path("/home/me/proj/train.py")
    assert short_path("/home/me/proj/train.py") == "proj/train.py"


def train_step(x, w):
    return (x @ w).sum().item()


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule

    x, w = torch.randn(16, 16), torch.randn(16, 16)
    path = tmp_path_factory.mktemp("stacks") / "cpu.json"
    with profile(
        activities=[ProfilerActivity.CPU],
        with_stack=True,
        schedule=schedule(wait=0, warmup=1, active=3, repeat=1),
    ) as prof:
        for _ in range(4):
            train_step(x, w)
            prof.step()
    prof.export_chrome_trace(str(path))
    return path


def test_cpu_trace_item_calls_sit_in_train_step_at_its_first_line(cpu_trace):
    loaded = load_trace_file(cpu_trace)
    events = loaded.events
    items = (
        events.filter(pl.col("name") == "aten::item")
        .select("pid", "tid", pl.col("ts").alias("start_us"))
        .with_row_index("call_id")
    )
    assert items.height == 3  # one per active step
    located = innermost_user_frame(items, user_frames(events))
    first_line = inspect.getsourcelines(train_step)[1]
    assert located["function"].to_list() == ["train_step"] * 3
    assert located["line"].to_list() == [first_line] * 3
    assert all(path.endswith("test_sync_sites.py") for path in located["file"].to_list())
    facts = compute_facts(events, loaded.metadata)
    assert facts.sync_sites is not None and facts.sync_sites.height == 0


def test_trace_without_stacks_has_no_sites_and_the_finding_says_so():
    loaded = load_trace_file(TRACES / "hta_a100_rank0_of_16.json.gz")
    facts = compute_facts(loaded.events, loaded.metadata)
    assert facts.sync_sites is None
    from diagnostics.rules import examples as ex

    findings = HostDeviceSync().check(ex.inputs(trace=facts), Thresholds())
    assert len(findings) == 1
    assert findings[0].evidence["sync_sites"] is None
    assert findings[0].evidence["sync_sites_note"] == NO_STACKS_NOTE
    assert "with_stack=True" in findings[0].recommendation


def test_finding_names_the_top_site_in_title_evidence_and_fix():
    # the rule's own example with stacks: aten::item in train_step (train.py:37), 2 ms/step
    example = HostDeviceSync.examples[0]
    (finding,) = HostDeviceSync().check(example.build(), Thresholds())
    top = finding.evidence["sync_sites"][0]
    assert top["site"] == "train.py:37"
    assert top["blocked_ms_per_step"] == 2.0
    assert top["calls_per_step"] == 1.0
    assert finding.title.endswith("mostly aten::item in train_step (train.py:37)")
    assert "train.py line 37" in finding.fix.code
    assert "sync_sites_note" not in finding.evidence
