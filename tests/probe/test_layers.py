"""The layers import downwards only: probe knows neither the trainer nor the analysis
internals, and the analysis never imports torch or probe (read from the source, not run)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT


def _imported_roots(package: str) -> dict[str, set[str]]:
    """Top-level module names each file of ``package`` imports, at any depth of the file."""
    found: dict[str, set[str]] = {}
    for path in sorted((REPO_ROOT / package).rglob("*.py")):
        roots: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots.add(node.module.split(".")[0])
        found[str(Path(path).relative_to(REPO_ROOT))] = roots
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("probe", {"trainer", "streamlit", "app_ui"}),
        ("diagnostics", {"torch", "probe", "trainer", "streamlit"}),
    ],
)
def test_package_does_not_import_the_layers_above_it(package, forbidden):
    offending = {
        path: sorted(roots & forbidden)
        for path, roots in _imported_roots(package).items()
        if roots & forbidden
    }
    assert offending == {}


def test_probe_uses_diagnostics_only_for_the_run_folder():
    users = {
        path: roots for path, roots in _imported_roots("probe").items() if "diagnostics" in roots
    }
    for path in users:
        source = (REPO_ROOT / path).read_text()
        modules = {
            node.module
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("diag")
        }
        # the run folder's own readers and writers: runs.py, and the writer of its memory/
        # snapshots (a pickle.dump to a temporary name and a rename; no analysis)
        run_folder_io = {"diagnostics.runs", "diagnostics.dotted", "diagnostics.snapshot.writer"}
        # and one hand-over: `pipeline-doctor gate` passes its arguments to the analyser's
        # own gate CLI untouched (probe.cli.main is the console entry point); no analysis
        # runs in probe
        run_folder_io |= {"diagnostics.gate.cli"} if path == "probe/cli.py" else set()
        assert modules <= run_folder_io, path
