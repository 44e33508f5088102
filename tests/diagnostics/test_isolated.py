"""Uploads analysed in a child process: the same result as in process, and every way the
child can end badly (over a budget, over its address-space limit, past its time limit) is
one line naming the limit while the calling process carries on."""

from __future__ import annotations

import gzip
import json
import zlib

import pytest

from diagnostics.analyze import analyze_files
from diagnostics.errors import InputError
from diagnostics.isolated import (
    DEFAULT_ANALYSIS_MEMORY_BYTES,
    DEFAULT_ANALYSIS_TIMEOUT_S,
    AnalysisStopped,
    ChildLimits,
    analyze_files_isolated,
)
from diagnostics.trace.budget import Limits
from tests.diagnostics.memory_limit import LARGE, TOO_LITTLE_MIB, TOO_LITTLE_SHOWN
from tests.diagnostics.trace.helpers import SHARED_TRACES

RESNET = SHARED_TRACES / "kineto_resnet50_num_workers_0.pt.trace.json.gz"
MIB = 1 << 20


def write_event_bomb(path, n_events: int) -> int:
    """A gzip trace of ``n_events`` valid kernels streamed through zlib; returns its size.

    Never held whole: one block of 1,000 events is compressed again and again; deflate
    packs the repeats about 200:1 (the issue's bomb: 5.3 MB to 1.5 GiB, ~290:1).
    """
    event = {
        "ph": "X",
        "cat": "kernel",
        "name": "volta_sgemm_128x64_nn",
        "pid": 0,
        "tid": 7,
        "ts": 1,
        "dur": 1,
        "args": {"device": 0, "stream": 7, "correlation": 1},
    }
    block = (",".join([json.dumps(event)] * 1000) + ",").encode()
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    with path.open("wb") as out:
        out.write(packer.compress(b'{"traceEvents":['))
        for _ in range(n_events // 1000):
            out.write(packer.compress(block))
        out.write(packer.compress(json.dumps(event).encode() + b"]}"))
        out.write(packer.flush())
    return path.stat().st_size


def test_the_child_gives_the_same_result_as_in_process():
    isolated = analyze_files_isolated([RESNET], display_names=["resnet.json.gz"])
    direct = analyze_files([RESNET], display_names=["resnet.json.gz"])
    assert isolated.to_json() == direct.to_json()
    assert isolated.facts.steps.equals(direct.facts.steps)


def test_an_event_bomb_is_refused_by_the_child_naming_the_event_limit(tmp_path):
    bomb = tmp_path / "bomb.json.gz"
    size = write_event_bomb(bomb, 400_000)
    with gzip.open(bomb, "rb") as inflated:
        json_bytes = sum(len(block) for block in iter(lambda: inflated.read(MIB), b""))
    assert json_bytes > 40 * MIB and json_bytes / size > 150
    with pytest.raises(InputError) as caught:
        analyze_files_isolated(
            [bomb], display_names=["bomb.json.gz"], limits=Limits(max_events=100_000)
        )
    assert str(caught.value).startswith("bomb.json.gz: holds more than 100,000 events")
    assert "PIPELINE_DOCTOR_MAX_EVENTS" in str(caught.value)


def test_over_the_address_space_limit_the_child_is_stopped_with_one_line():
    # too little address space to read the 216k-event trace: the child fails (a MemoryError,
    # or polars aborts it with SIGABRT, as it would the server)
    with pytest.raises(AnalysisStopped) as caught:
        analyze_files_isolated(
            [LARGE],
            display_names=["large.json.gz"],
            child=ChildLimits(memory_bytes=TOO_LITTLE_MIB * MIB),
        )
    message = str(caught.value)
    assert message.startswith(f"large.json.gz: the analysis needed more than {TOO_LITTLE_SHOWN}")
    assert "PIPELINE_DOCTOR_ANALYSIS_MEMORY_MB" in message and "\n" not in message
    # and this process carries on: the next analysis works
    assert analyze_files_isolated([RESNET]).summary["steps"] == 6


def test_past_the_time_limit_the_child_is_killed_with_one_line():
    with pytest.raises(AnalysisStopped) as caught:
        analyze_files_isolated(
            [LARGE], display_names=["large.json.gz"], child=ChildLimits(timeout_s=0.5)
        )
    assert str(caught.value).startswith(
        "large.json.gz: the analysis took longer than 0.5 s, the time limit "
        "(raise PIPELINE_DOCTOR_ANALYSIS_TIMEOUT_S)"
    )


def test_bad_input_in_the_child_is_the_analysers_own_line(tmp_path):
    path = tmp_path / "x.json.gz"
    path.write_bytes(gzip.compress(b"{not json"))
    with pytest.raises(InputError) as caught:
        analyze_files_isolated([path], display_names=["broken.json.gz"])
    assert not isinstance(caught.value, AnalysisStopped)
    assert str(caught.value).startswith("broken.json.gz: is not valid JSON")


def test_child_limits_from_the_environment():
    assert ChildLimits.from_env({}) == ChildLimits(
        DEFAULT_ANALYSIS_MEMORY_BYTES, DEFAULT_ANALYSIS_TIMEOUT_S
    )
    limits = ChildLimits.from_env(
        {"PIPELINE_DOCTOR_ANALYSIS_MEMORY_MB": "1024", "PIPELINE_DOCTOR_ANALYSIS_TIMEOUT_S": "9"}
    )
    assert limits == ChildLimits(memory_bytes=1024 * MIB, timeout_s=9.0)
    with pytest.raises(ValueError, match="PIPELINE_DOCTOR_ANALYSIS_TIMEOUT_S"):
        ChildLimits.from_env({"PIPELINE_DOCTOR_ANALYSIS_TIMEOUT_S": "-1"})


def test_cli_with_a_memory_limit_is_exit_2_naming_the_limit(capsys):
    from diagnostics.__main__ import main

    assert main(["analyze", str(LARGE), "--max-memory-mb", str(TOO_LITTLE_MIB)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(
        f"error: {LARGE}: the analysis needed more than {TOO_LITTLE_SHOWN}"
    )
    assert captured.err.count("\n") == 1


def test_cli_with_a_timeout_is_exit_2_naming_the_limit(capsys):
    from diagnostics.__main__ import main

    assert main(["analyze", str(LARGE), "--timeout-s", "0.5"]) == 2
    assert capsys.readouterr().err.startswith(
        f"error: {LARGE}: the analysis took longer than 0.5 s, the time limit"
    )


def test_cli_in_a_child_gives_the_same_json_as_in_process(capsys):
    from diagnostics.__main__ import main

    assert main(["analyze", str(RESNET)]) == 0
    direct = json.loads(capsys.readouterr().out)
    assert main(["analyze", str(RESNET), "--max-memory-mb", "8192", "--timeout-s", "300"]) == 0
    assert json.loads(capsys.readouterr().out) == direct
