"""One run-folder vocabulary: file names and the runs directory are spelled in runs.py only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from diagnostics import runs
from diagnostics.views import resolve_runs_dir

REPO = Path(__file__).resolve().parents[2]
NAMES = {
    name: getattr(runs, name)
    for name in (
        "MANIFEST_FILE",
        "STATUS_FILE",
        "STEPS_LINES",
        "SAMPLES_LINES",
        "STEPS_PARQUET",
        "SAMPLES_PARQUET",
        "MEMORY_LINES_FILE",
        "LOG_FILE",
        "LOCK_FILE",
        "CHECKPOINT_DIR",
        "TOKENIZER_FILE",
        "CANCEL_FILE",
        "RUNS_DIR_ENV",
    )
}


def _sources() -> list[Path]:
    roots = [REPO / "trainer", REPO / "diagnostics", REPO / "app_ui", REPO / "pages"]
    files = [p for root in roots for p in root.rglob("*.py")] + [REPO / "app.py"]
    return [p for p in files if p != REPO / "diagnostics" / "runs.py"]


def test_run_folder_names_are_spelled_only_in_runs_py():
    spelled = []
    values = {value: name for name, value in NAMES.items()}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in values:
                rel = path.relative_to(REPO)
                spelled.append(f"{rel}:{node.lineno} {node.value!r} (runs.{values[node.value]})")
    assert spelled == []


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, "runs"),
        ({"PIPELINE_DOCTOR_RUNS_DIR": ""}, "runs"),
        ({"PIPELINE_DOCTOR_RUNS_DIR": "/x/r"}, "/x/r"),
    ],
)
def test_default_runs_dir_unset_or_empty_is_runs(environ, expected):
    assert runs.default_runs_dir(environ) == Path(expected)
    assert resolve_runs_dir(environ) == Path(expected)


def test_default_runs_dir_is_read_at_call_time(monkeypatch, tmp_path):
    from trainer import launch

    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(tmp_path / "later"))
    assert runs.default_runs_dir() == tmp_path / "later"
    (tmp_path / "later").mkdir()
    assert launch.active_runs() == []
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", "")
    assert runs.default_runs_dir() == Path("runs")
