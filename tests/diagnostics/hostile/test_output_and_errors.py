"""Hostile and odd input, round two (issue 23): the probes, kept as tests.

Every case is built here at test time from a real trace of ../shared/traces (json-loaded,
one field changed, written to tmp_path) or a real H200 run folder of ../shared/gpu-runs,
and run through the real CLI (``python -m diagnostics``) where the issue is about the CLI.
The verdict for each is written out: exit code, one line on stderr, what the line names.

- ``-o`` replaces only a regular file or makes a new one: a device, a FIFO, a symbolic
  link and a directory are refused (exit 2, one line) and left as they were.
- Every limit flag and variable refuses nan, inf, negative, zero and absurd values.
- A field the analyser reads (deviceProperties, distributedInfo, a run manifest's world
  size) that holds no usable number is one line naming the file and the field; an odd step
  name is read (its number unknown) and hides no finding.
- A bug is exit 1 and bad input exit 2, whether or not the analysis runs in the bounded
  child.
- Names from the input (file, GPU, PyTorch version) reach stderr and the text output with
  newlines and control characters as visible escapes.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from diagnostics.facts import compute_facts
from diagnostics.model import AnalysisInputs
from diagnostics.printable import printable
from diagnostics.rules.engine import run_rules
from diagnostics.rules.registry import RULES
from diagnostics.trace.loader import load
from tests.diagnostics.trace.helpers import SHARED_TRACES

REPO_ROOT = Path(__file__).resolve().parents[3]
SHARED_RUNS = SHARED_TRACES.parent / "gpu-runs" / "h200-default"
# 1.4k events: the quick base for everything that is not about profiler steps
SMALL = SHARED_TRACES / "hta_a100_alexnet_with_syncs.json.gz"
# six ProfilerStep#N ranges and a DataLoader-bound run: too-few-workers fires (high) on it
STEPPED = SHARED_TRACES / "kineto_resnet50_num_workers_0.pt.trace.json.gz"
HEALTHY_RUN = SHARED_RUNS / "gpu-healthy"
# DataLoader-bound (one worker, slow samples): too-few-workers fires on it
SLOW_LOADER_RUN = SHARED_RUNS / "gpu-slow-loader"

# what the terminal must never receive raw from a name in the input
RAW_CONTROLS = ("\x1b", "\x00", "\u202e")
HOSTILE_NAME = "A100\x1b[31mRED\u202e\x00X\nline"


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diagnostics", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        errors="surrogateescape",
        timeout=180,
        env={**os.environ, **(env or {})},
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The single line of stderr; fails when there is a traceback or a second line."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def small_doc() -> dict[str, Any]:
    with gzip.open(SMALL, "rt", encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def stepped_doc() -> dict[str, Any]:
    with gzip.open(STEPPED, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def write_doc(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def renamed_steps(doc: dict[str, Any], names: list[str] | None, every: str | None = None):
    """A copy of ``doc`` whose first ProfilerStep ranges take ``names`` (or all ``every``)."""
    doc = copy.deepcopy(doc)
    steps = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert len(steps) == 6  # the six of the real trace (PyTorch profiler schedule, active 6)
    for i, event in enumerate(steps):
        if every is not None:
            event["name"] = every
        elif names and i < len(names):
            event["name"] = names[i]
    return doc


# -- the hostile traces that must load ------------------------------------------------------
# name -> builder(small_doc, stepped_doc) of a trace the analyser must read, not refuse


def _unnumbered_step(_small, stepped):
    return renamed_steps(stepped, ["ProfilerStep#abc"])


def _step_past_int64(_small, stepped):
    return renamed_steps(stepped, ["ProfilerStep#99999999999999999999"])


def _no_step_numbered(_small, stepped):
    return renamed_steps(stepped, None, every="ProfilerStep#abc")


def _hostile_names(small, _stepped):
    doc = copy.deepcopy(small)
    doc["deviceProperties"][0]["name"] = HOSTILE_NAME
    doc["pytorch_version"] = "2.0\x1b[2J\u202e"
    return doc


def _negative_rank(small, _stepped):
    # a process outside any process group: read as "no rank", as before
    doc = copy.deepcopy(small)
    doc["distributedInfo"] = {"rank": -1}
    return doc


LOADABLE = {
    "unnumbered_step": _unnumbered_step,
    "step_past_int64": _step_past_int64,
    "no_step_numbered": _no_step_numbered,
    "hostile_names": _hostile_names,
    "negative_rank": _negative_rank,
}


@pytest.mark.parametrize("case", sorted(LOADABLE))
def test_every_rule_runs_without_error_on_each_hostile_trace(
    tmp_path, small_doc, stepped_doc, case
):
    """The engine records a rule that raised in RulesOutcome.errors (shown to the user only
    as a warning, its finding lost): on every hostile input that loads it stays empty."""
    path = write_doc(tmp_path / f"{case}.json", LOADABLE[case](small_doc, stepped_doc))
    loaded = load(path)
    (trace,) = loaded.traces
    facts = compute_facts(trace.events, trace.metadata)
    outcome = run_rules(AnalysisInputs(trace=facts, run=None, events=trace.events))
    assert outcome.errors == ()
    ran = {f.rule for f in outcome.findings} | {s.rule for s in outcome.skipped}
    # every registered rule either ran (a finding, or silently nothing) or said why not
    assert ran <= {rule.id for rule in RULES}


# hand-edited run manifests whose values the rules read: (section, key, value)
RUN_EDITS = {
    # before: too-few-workers raised TypeError ("can't multiply sequence by non-int")
    "workers_in_words": ("config", ("data", "num_workers"), "many"),
    "batch_in_words": ("config", ("train", "batch_size"), "lots"),
    "cores_in_words": ("environment", ("cpu_count",), "x"),
    "gpu_memory_in_words": ("environment", ("gpu_memory_bytes",), "x"),
    "hostile_gpu_name": ("environment", ("gpu_name",), HOSTILE_NAME),
}


def edited_run(tmp_path: Path, section: str, keys: tuple[str, ...], value: Any) -> Path:
    run = tmp_path / "run"
    shutil.copytree(SLOW_LOADER_RUN, run)
    manifest = json.loads((run / "run.json").read_text())
    place = manifest[section]
    for key in keys[:-1]:
        place = place[key]
    place[keys[-1]] = value
    (run / "run.json").write_text(json.dumps(manifest))
    return run


@pytest.mark.parametrize("case", sorted(RUN_EDITS))
def test_every_rule_runs_without_error_on_each_hostile_run(tmp_path, case):
    loaded = load(edited_run(tmp_path, *RUN_EDITS[case]))
    trace = loaded.traces[0]
    facts = compute_facts(trace.events, trace.metadata)
    outcome = run_rules(AnalysisInputs(trace=facts, run=loaded.run, events=trace.events))
    assert outcome.errors == ()
    # the H200 slow-loader run's own finding survives the edit
    assert "too-few-workers" in {f.rule for f in outcome.findings}


def test_a_hostile_gpu_name_in_a_run_is_escaped_in_text_output(tmp_path):
    run = edited_run(tmp_path, *RUN_EDITS["hostile_gpu_name"])
    proc = run_cli("analyze", str(run), "--format", "text")
    assert proc.returncode == 0, proc.stderr
    assert not any(c in proc.stdout for c in RAW_CONTROLS)
    assert printable(HOSTILE_NAME) in proc.stdout.splitlines()[0]


@pytest.mark.parametrize(
    ("case", "odd_name"),
    [
        ("unnumbered_step", "ProfilerStep#abc"),
        ("step_past_int64", "ProfilerStep#99999999999999999999"),
    ],
)
def test_an_odd_step_name_keeps_the_data_wait_finding(
    tmp_path, small_doc, stepped_doc, case, odd_name
):
    """Before: too-few-workers raised ChartError on #abc (its high finding gone, one line in
    warnings) and #999...9 failed polars' Int64 cast (internal error, exit 1). The range is
    still a step: the six steps, the 33.5 % median data wait and the high finding of the
    unchanged trace (`analyze` on it: steps 6, data wait 33.5 %, too-few-workers high)."""
    path = write_doc(tmp_path / f"{case}.json", LOADABLE[case](small_doc, stepped_doc))
    proc = run_cli("analyze", str(path))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["summary"]["steps"] == 6
    assert doc["summary"]["data_wait_pct"] == pytest.approx(33.5, abs=0.05)
    assert [f["severity"] for f in doc["findings"] if f["rule"] == "too-few-workers"] == ["high"]
    assert not any("failed and was skipped" in w for w in doc["warnings"])
    assert any(odd_name in w and "number unknown" in w for w in doc["warnings"])


# -- fields that hold no usable number: one line naming the file and the field ------------------


def _device_memory_in_words(small):
    doc = copy.deepcopy(small)
    doc["deviceProperties"][0]["totalGlobalMem"] = "lots"
    return doc


def _rank_past_int32(small):
    doc = copy.deepcopy(small)
    doc["distributedInfo"] = {"rank": 10**30, "world_size": 2, "backend": "nccl"}
    return doc


def _world_size_in_words(small):
    doc = copy.deepcopy(small)
    doc["distributedInfo"] = {"rank": 0, "world_size": "many"}
    return doc


@pytest.mark.parametrize(
    ("builder", "field"),
    [
        # before: exit 0, batch-too-small failed ("invalid literal for int()"), its check lost
        (_device_memory_in_words, "deviceProperties[0].totalGlobalMem"),
        # before: internal error, exit 1 (polars: conversion from i128 to i32 failed)
        (_rank_past_int32, "distributedInfo.rank"),
        (_world_size_in_words, "distributedInfo.world_size"),
    ],
)
def test_an_unusable_metadata_number_is_one_line_naming_the_field(
    tmp_path, small_doc, builder, field
):
    path = write_doc(tmp_path / "t.json", builder(small_doc))
    proc = run_cli("analyze", str(path))
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert line.startswith(f"error: {path}: {field} is ")


def test_a_run_manifest_world_size_in_words_is_one_line(tmp_path):
    """Before: internal error, exit 1 (int('many') in RunFolder.world_size)."""
    run = tmp_path / "run"
    shutil.copytree(HEALTHY_RUN, run)
    manifest = json.loads((run / "run.json").read_text())
    manifest["distributed"] = {"world_size": "many"}
    (run / "run.json").write_text(json.dumps(manifest))
    proc = run_cli("analyze", str(run))
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert line.startswith(f"error: {run}: ") and "distributed.world_size is 'many'" in line


def test_a_latin1_byte_in_a_name_is_one_line_naming_the_file(tmp_path, small_doc):
    raw = json.dumps(small_doc).encode()
    at = raw.index(b'"name": "') + len(b'"name": "')
    path = tmp_path / "latin1.json"
    path.write_bytes(raw[:at] + b"caf\xe9 " + raw[at:])  # é in Latin-1: not UTF-8
    proc = run_cli("analyze", str(path))
    assert proc.returncode == 2
    assert one_error_line(proc).startswith(f"error: {path}: ")


# -- one clean line: names shown escaped -----------------------------------------------------


def test_gpu_name_and_version_controls_are_escaped_in_text_output(tmp_path, small_doc):
    path = write_doc(tmp_path / "names.json", _hostile_names(small_doc, None))
    proc = run_cli("analyze", str(path), "--format", "text")
    assert proc.returncode == 0, proc.stderr
    assert not any(c in proc.stdout for c in RAW_CONTROLS)
    head = proc.stdout.splitlines()[0]
    # the newline inside the GPU name did not split the header line
    assert r"A100\x1b[31mRED\u202e\x00X\nline" in head
    assert r"PyTorch 2.0\x1b[2J\u202e" in head


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("bad\nname.json", r"bad\nname.json"),
        ("esc\x1b[31mred.json", r"esc\x1b[31mred.json"),
        ("rlo\u202egnp.json", r"rlo\u202egnp.json"),
    ],
)
def test_a_hostile_file_name_is_one_error_line_with_escapes(tmp_path, name, shown):
    path = tmp_path / name
    path.write_bytes(b"{not json")
    proc = run_cli("analyze", str(path))
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert line.startswith(f"error: {tmp_path}/{shown}: ")
    assert not any(c in proc.stderr for c in RAW_CONTROLS)


def test_a_non_utf8_file_name_is_shown_as_its_byte(tmp_path):
    path = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9.json"))
    path.write_bytes(b"{not json")
    proc = run_cli("analyze", str(path))
    assert proc.returncode == 2
    assert one_error_line(proc).startswith(f"error: {tmp_path}/caf\\xe9.json: ")


def test_printable_escapes_only_what_a_terminal_would_act_on():
    assert printable("NVIDIA H200 · café 日本") == "NVIDIA H200 · café 日本"
    assert printable("a\nb\tc\x1b[0m\x00\u202e\x7f") == r"a\nb\tc\x1b[0m\x00\u202e\x7f"
    assert printable(printable(HOSTILE_NAME)) == printable(HOSTILE_NAME)


# -- -o writes as Unix tools do, and never destroys -----------------------------------------


def _char_device(tmp_path: Path, minor: int) -> Path:
    """A character device of our own with memory-device numbers (1, minor): 3 is null, 7
    full; the system's own node when mknod is not permitted (its type is checked after the
    run either way)."""
    node = tmp_path / f"mem-{minor}"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    except (PermissionError, OSError):
        node = Path({3: "/dev/null", 7: "/dev/full"}[minor])
        assert stat.S_ISCHR(node.lstat().st_mode), f"{node} is not a character device"
    return node


def _identity(path: Path) -> tuple[int, int, int]:
    info = path.lstat()
    return info.st_ino, stat.S_IFMT(info.st_mode), info.st_rdev


def _extra(command: str) -> list[str]:
    return ["--format", "md"] if command == "report" else []


@pytest.mark.parametrize("command", ["analyze", "report"])
def test_output_through_a_symlink_replaces_its_target_and_keeps_the_link(tmp_path, command):
    """Before: "is a symbolic link", exit 2 (and before that, the link became a file)."""
    target = tmp_path / "target.out"
    target.write_text("old")
    target.chmod(0o600)
    link = tmp_path / "link.out"
    link.symlink_to(target)
    proc = run_cli(command, str(SMALL), *_extra(command), "-o", str(link))
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() != "old" and "alexnet" in target.read_text().lower()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.out", "target.out"]


@pytest.mark.parametrize("command", ["analyze", "report"])
def test_output_to_a_device_is_written_in_place(tmp_path, command):
    """Before: "is a device", exit 2: -o /dev/null was refused."""
    null = _char_device(tmp_path, 3)
    before = _identity(null)
    proc = run_cli(command, str(SMALL), *_extra(command), "-o", str(null))
    assert proc.returncode == 0, proc.stderr
    assert _identity(null) == before
    full = _char_device(tmp_path, 7)
    before = _identity(full)
    proc = run_cli(command, str(SMALL), *_extra(command), "-o", str(full))
    assert proc.returncode == 2
    assert one_error_line(proc) == f"error: {full}: cannot write (No space left on device)"
    assert _identity(full) == before


def test_output_to_a_named_pipe_is_written_in_place(tmp_path):
    import threading

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(pipe.read_bytes()), daemon=True)
    reader.start()
    proc = run_cli("analyze", str(SMALL), "-o", str(pipe))
    reader.join(timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(received[0])["schema"] == "pipeline-doctor/analysis/v1"
    assert stat.S_ISFIFO(pipe.lstat().st_mode)


@pytest.mark.parametrize("name", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"])
def test_output_to_dev_stdout_is_standard_output(name):
    """Before: "/dev/stdout: is a symbolic link", exit 2."""
    proc = run_cli("analyze", str(SMALL), "-o", name)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["schema"] == "pipeline-doctor/analysis/v1"


@pytest.mark.parametrize("command", ["analyze", "report"])
@pytest.mark.parametrize("kind", ["directory", "socket", "link to a directory"])
def test_output_that_is_no_file_is_refused_and_untouched(tmp_path, command, kind):
    import socket

    out = tmp_path / "out"
    if kind == "directory":
        out.mkdir()
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(out))
    else:
        (tmp_path / "folder").mkdir()
        out.symlink_to(tmp_path / "folder")
    before = _identity(out)
    proc = run_cli(command, str(SMALL), *_extra(command), "-o", str(out))
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert line.startswith(f"error: {out}: is a ") and "left untouched" in line
    assert _identity(out) == before


def test_a_block_device_is_refused(monkeypatch, tmp_path):
    """A report is never meant for a disk: -o /dev/sda is refused, not written."""
    from diagnostics import text_output

    disk = tmp_path / "sda"
    real_lstat = os.lstat

    def lstat(path, *args, **kwargs):
        if os.fspath(path) == str(disk):
            return os.stat_result((stat.S_IFBLK | 0o660, 1, 1, 1, 0, 0, 0, 0, 0, 0))
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(text_output.os, "lstat", lstat)
    with pytest.raises(text_output.OutputRefused, match="is a block device, not a file"):
        text_output.write_output(disk, "report")
    assert not disk.exists()


def test_an_html_report_is_not_printed_to_a_terminal(tmp_path):
    """Before: `report RUN` printed megabytes of HTML into the terminal."""
    import pty

    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "diagnostics", "report", str(SMALL)],
            cwd=REPO_ROOT,
            stdout=follower,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: an HTML report is a page for a browser")
    assert "-o report.html" in proc.stderr and proc.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "command",
    [["-m", "diagnostics", "rules"], ["-m", "trainer.config_docs"]],
    ids=["rules", "config-docs"],
)
def test_the_reference_writers_write_a_device_in_place_and_refuse_a_directory(tmp_path, command):
    """The other -o writers (diagnostics.text_output.emit_or_exit_code)."""
    full = _char_device(tmp_path, 7)
    before = _identity(full)
    folder = tmp_path / "folder"
    folder.mkdir()
    for out, code, start in (
        (full, 2, f"error: {full}: cannot write (No space left on device)"),
        (folder, 2, f"error: {folder}: is a directory"),
    ):
        proc = subprocess.run(
            [sys.executable, *command, "-o", str(out)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == code
        assert one_error_line(proc).startswith(start)
    assert _identity(full) == before
    assert folder.is_dir()


@pytest.mark.parametrize("name", ["", "new/"])
def test_output_that_names_no_file_is_refused(tmp_path, name):
    """Before: "" was an internal error (Path.with_name on an empty name) and "new/" wrote
    a file called "new"."""
    out = f"{tmp_path}/{name}" if name else name
    proc = run_cli("analyze", str(SMALL), "-o", out)
    assert proc.returncode == 2
    assert "is not a file name" in one_error_line(proc)
    assert list(tmp_path.iterdir()) == []


def test_output_to_a_regular_file_keeps_its_permissions_and_dash_is_stdout(tmp_path):
    out = tmp_path / "result.json"
    out.write_text("old")
    out.chmod(0o600)
    assert run_cli("analyze", str(SMALL), "-o", str(out)).returncode == 0
    assert json.loads(out.read_text())["schema"] == "pipeline-doctor/analysis/v1"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    proc = run_cli("analyze", str(SMALL), "-o", "-")
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["schema"] == "pipeline-doctor/analysis/v1"
    assert not (REPO_ROOT / "-").exists()


# -- limits parse strictly ----------------------------------------------------------------------

LIMIT_FLAGS = ("--max-decompressed-mb", "--max-events", "--max-memory-mb", "--timeout-s")
LIMIT_VARIABLES = (
    "PIPELINE_DOCTOR_MAX_DECOMPRESSED_MB",
    "PIPELINE_DOCTOR_MAX_EVENTS",
    "PIPELINE_DOCTOR_ANALYSIS_MEMORY_MB",
    "PIPELINE_DOCTOR_ANALYSIS_TIMEOUT_S",
    "PIPELINE_DOCTOR_MAX_ANALYSES",
)
# not a finite number, not positive, or past any meaningful bound (1e30 MiB, 1e30 s)
BAD_LIMITS = ("nan", "inf", "-inf", "-1", "0", "1e30", "lots")


@pytest.mark.parametrize("flag", LIMIT_FLAGS)
@pytest.mark.parametrize("value", BAD_LIMITS)
def test_every_limit_flag_refuses_a_meaningless_value(flag, value):
    """Before: nan, inf and 1e400 for --max-decompressed-mb were a 16-line traceback."""
    proc = run_cli("analyze", str(SMALL), f"{flag}={value}")
    assert proc.returncode == 2
    assert one_error_line(proc).startswith(f"error: argument {flag}: '{value}' ")


@pytest.mark.parametrize("variable", LIMIT_VARIABLES)
@pytest.mark.parametrize("value", BAD_LIMITS)
def test_every_limit_variable_refuses_a_meaningless_value(variable, value):
    # --timeout-s makes the CLI read the child's variables too (memory, timeout, analyses)
    proc = run_cli("analyze", str(SMALL), "--timeout-s", "120", env={variable: value})
    assert proc.returncode == 2
    assert one_error_line(proc).startswith(f"error: {variable}='{value}' ")


@pytest.mark.parametrize(
    ("flag", "value"), [("--max-events", "1.5"), ("--max-decompressed-mb", "1e-300")]
)
def test_a_fraction_of_an_event_or_of_a_byte_is_refused(flag, value):
    proc = run_cli("analyze", str(SMALL), flag, value)
    assert proc.returncode == 2
    assert one_error_line(proc).startswith(f"error: argument {flag}: '{value}' ")


# -- a bug is exit 1, bad input exit 2, in this process or in the bounded child ----------------

PLANTED_BUG = """
import os
if os.environ.get("PIPELINE_DOCTOR_TEST_PLANTED_BUG"):
    import diagnostics.analyze as analyze_module

    def _planted(*args, **kwargs):
        raise RuntimeError("planted bug")

    analyze_module.analyze_loaded = _planted
"""


@pytest.mark.parametrize("bounded", [False, True], ids=["in-process", "bounded-child"])
def test_exit_codes_do_not_depend_on_the_address_space_limit(tmp_path, small_doc, bounded):
    """Before: a bug was exit 1 in this process and exit 2 in the bounded child (which the
    CLI uses under ulimit -v or --max-memory-mb/--timeout-s)."""
    (tmp_path / "sitecustomize.py").write_text(PLANTED_BUG)
    env = {
        # the repo too: sitecustomize is imported before -m puts the folder on sys.path
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(tmp_path), str(REPO_ROOT), os.environ.get("PYTHONPATH")])
        ),
        "PIPELINE_DOCTOR_TEST_PLANTED_BUG": "1",
    }
    limit = ["--timeout-s", "120"] if bounded else []
    bug = run_cli("analyze", str(SMALL), *limit, env=env)
    assert bug.returncode == 1
    assert "planted bug" in one_error_line(bug)

    bad = write_doc(tmp_path / "bad.json", _device_memory_in_words(small_doc))
    refused = run_cli("analyze", str(bad), *limit)
    assert refused.returncode == 2
    assert one_error_line(refused).startswith(f"error: {bad}: deviceProperties[0]")


# -- the page shows names the same way ----------------------------------------------------------


def test_page_text_and_upload_tables_show_names_escaped():
    import polars as pl

    from app_ui.safe_text import md_text, shown
    from diagnostics.views.upload_set import IDENTITY_LABELS, labelled

    assert shown(md_text(HOSTILE_NAME)) == r"A100\x1b[31mRED\u202e\x00X\nline"
    table = labelled(pl.DataFrame({"file": ["a\nb.json"], "gpu": [HOSTILE_NAME]}), IDENTITY_LABELS)
    assert table.row(0) == (r"a\nb.json", printable(HOSTILE_NAME))
