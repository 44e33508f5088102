"""One byte budget and one event budget for the whole input (all files together), and
resource failures (deep nesting, no memory) as exit 2 with one line naming the limit."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from diagnostics.__main__ import main
from diagnostics.analyze import analyze, analyze_files
from diagnostics.errors import InputError
from diagnostics.trace.budget import DEFAULT_MAX_EVENTS, Limits, host_memory_bytes
from diagnostics.trace.loader import load
from tests.diagnostics.trace.helpers import SHARED_TRACES, kernel, trace_doc

MIB = 1 << 20
SMALL_REAL = SHARED_TRACES / "hta_a100_alexnet_with_syncs.json.gz"


def write_kernels(path, n: int, *, pad: int = 0) -> None:
    """A gzip trace of ``n`` kernels, each padded with ``pad`` bytes of args text."""
    events = [
        {**kernel(float(i * 10), 5.0, correlation=i), "args": {"pad": "x" * pad}} for i in range(n)
    ]
    path.write_bytes(gzip.compress(json.dumps(trace_doc(events)).encode(), 6))


def test_files_under_the_byte_limit_one_by_one_are_refused_together(tmp_path):
    # three ~0.4 MiB files against a 1 MiB budget: each alone fits, together they do not
    # (the issue: three 60 MiB files passed a 100 MiB cap that was counted per file)
    paths = [tmp_path / f"rank{i}.json.gz" for i in range(3)]
    for path in paths:
        write_kernels(path, 1000, pad=300)
        assert 0.3 * MIB < len(gzip.decompress(path.read_bytes())) < 0.5 * MIB
        analyze(path, max_decompressed_bytes=MIB)  # fine on its own
    with pytest.raises(InputError, match=r"rank2\.json\.gz: decompresses to more than 1\.0 MiB"):
        analyze_files(paths, max_decompressed_bytes=MIB)
    # and the same for a folder of ranks
    with pytest.raises(InputError, match=r"all files of the input together"):
        load(tmp_path, max_decompressed_bytes=MIB)


def test_events_over_the_event_budget_are_refused_naming_the_flag_and_variable(tmp_path):
    path = tmp_path / "many.json.gz"
    write_kernels(path, 3000)
    assert analyze(path, max_events=3000).summary["events"] == 3000
    with pytest.raises(InputError) as caught:
        analyze(path, max_events=2999)
    message = str(caught.value)
    assert message.startswith(f"{path}: holds more than 2,999 events")
    assert "--max-events" in message and "PIPELINE_DOCTOR_MAX_EVENTS" in message


def test_event_budget_is_shared_by_the_files_of_an_upload(tmp_path):
    paths = [tmp_path / f"rank{i}.json.gz" for i in range(2)]
    for path in paths:
        write_kernels(path, 600)
    assert analyze_files(paths, max_events=1200).summary["events"] == 1200
    with pytest.raises(InputError, match=r"rank1\.json\.gz: holds more than 1,000 events"):
        analyze_files(paths, max_events=1000)


def test_cli_max_events_flag_and_environment_variable(tmp_path, capsys, monkeypatch):
    path = tmp_path / "many.json.gz"
    write_kernels(path, 3000)
    assert main(["analyze", str(path), "--max-events", "100"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: holds more than 100 events") and err.count("\n") == 1
    monkeypatch.setenv("PIPELINE_DOCTOR_MAX_EVENTS", "200")
    assert main(["report", str(path), "--format", "json", "-o", str(tmp_path / "r.json")]) == 2
    assert "holds more than 200 events" in capsys.readouterr().err
    monkeypatch.setenv("PIPELINE_DOCTOR_MAX_EVENTS", "lots")
    assert main(["analyze", str(path)]) == 2
    assert capsys.readouterr().err == ("error: PIPELINE_DOCTOR_MAX_EVENTS='lots' is not a number\n")


def test_limits_from_the_environment_and_their_defaults():
    assert Limits.from_env({}) == Limits()
    assert Limits().max_events == DEFAULT_MAX_EVENTS
    limits = Limits.from_env(
        {"PIPELINE_DOCTOR_MAX_DECOMPRESSED_MB": "10", "PIPELINE_DOCTOR_MAX_EVENTS": "5e3"}
    )
    assert limits == Limits(max_decompressed_bytes=10 * MIB, max_events=5000)
    with pytest.raises(ValueError, match="must be positive"):
        Limits.from_env({"PIPELINE_DOCTOR_MAX_EVENTS": "0"})


GIB = 1 << 30


def test_the_command_line_sizes_its_limits_to_the_machine_so_a_1_gb_trace_goes_through():
    """Issue 19's case: a 1 GB, 5.6 M-event trace on a 24 GiB machine. Half of the memory
    at 512 bytes an event is 25.2 M events (24 * 2**30 / 2 / 512), and 400 bytes of JSON
    each is 9.4 GiB; the app's own budget stays at 5 M events."""
    limits = Limits.for_command_line({}, memory_bytes=24 * GIB)
    assert limits.max_events == 24 * GIB // 2 // 512 == 25_165_824
    assert limits.max_decompressed_bytes == 25_165_824 * 400
    assert limits.max_events > 5_600_000 and limits.max_decompressed_bytes > GIB
    assert Limits.from_env({}).max_events == 5_000_000


def test_a_small_machine_keeps_the_apps_limits_and_the_environment_still_wins():
    assert Limits.for_command_line({}, memory_bytes=2 * GIB) == Limits()
    env = {"PIPELINE_DOCTOR_MAX_EVENTS": "1000", "PIPELINE_DOCTOR_MAX_DECOMPRESSED_MB": "3"}
    assert Limits.for_command_line(env, memory_bytes=64 * GIB) == Limits(3 * MIB, 1000)


def test_the_machines_size_is_what_this_process_may_use():
    """Under ``ulimit -v`` (here 3 GiB, in a child) the address-space limit is the size."""
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
        "from diagnostics.trace.budget import host_memory_bytes; print(host_memory_bytes())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(done.stdout) == 3 << 30
    assert host_memory_bytes() >= 1 << 30  # this machine, unlimited: its physical memory


@pytest.mark.parametrize("where", ["args", "top", "document"])
def test_json_nested_100k_deep_is_exit_2_naming_the_recursion_limit(tmp_path, capsys, where):
    deep = "[" * 100_000 + "]" * 100_000
    event = '{"ph":"X","name":"a","ts":1,"dur":1,"pid":1,"tid":1}'
    text = {
        "args": '{"traceEvents":[{"ph":"X","name":"a","ts":1,"dur":1,"args":{"x":' + deep + "}}]}",
        "top": '{"deviceProperties":' + deep + ',"traceEvents":[' + event + "]}",
        "document": deep,
    }[where]
    path = tmp_path / "deep.json"
    path.write_text(text)
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {path}: nests JSON arrays or objects deeper than the decoder's recursion "
        "limit; not a Chrome trace\n"
    )


def test_memory_error_is_exit_2_naming_the_limit(tmp_path, capsys, monkeypatch):
    # A MemoryError from deep inside the analysis (here: the rules) must not be exit 1
    import diagnostics.analyze as analyze_module

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(analyze_module, "run_rules", no_memory)
    assert main(["analyze", str(SMALL_REAL)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {SMALL_REAL}: not enough memory to analyse it (")
    assert "memory" in err and err.count("\n") == 1


def test_a_run_folder_over_the_budget_is_refused_not_analysed_without_its_trace(tmp_path):
    # a run's unreadable trace window is left out with a warning; a trace over the budget
    # must not be, or the budget would silently turn into "analysed without the trace"
    from tests.diagnostics.test_analyze import one_step_trace, write_run

    run = write_run(tmp_path, [10.0, 20.0], trace=one_step_trace(2000.0, 500.0, 0))
    assert analyze(run).facts is not None
    with pytest.raises(InputError, match=r"holds more than 1 events"):
        analyze(run, max_events=1)
