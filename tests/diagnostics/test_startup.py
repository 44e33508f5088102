"""The analyser's imports at a command's start: all of them made, the collector left as it
was found, and what the imports made frozen out of later collections."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("enabled", [True, False])
def test_the_imports_leave_the_collector_as_they_found_it(enabled):
    code = (
        "import gc, sys\n"
        f"{'' if enabled else 'gc.disable()'}\n"
        "from diagnostics.startup import import_analyser\n"
        "import_analyser()\n"
        "print(gc.isenabled(), 'diagnostics.analyze' in sys.modules, gc.get_freeze_count())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    collector, imported, frozen = done.stdout.split()
    assert collector == str(enabled)
    assert imported == "True"
    assert int(frozen) > 10_000  # polars and the analyser: tens of thousands of objects


def test_the_cli_analyses_with_the_collector_on(tmp_path):
    # the pause covers the imports only: the analysis itself runs with the collector on
    trace = tmp_path / "t.json"
    trace.write_text(
        '{"traceEvents": [{"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 1, '
        '"dur": 5, "pid": 1, "tid": 1}]}'
    )
    code = (
        "import gc, sys\n"
        "import diagnostics.analyze as a\n"
        "seen = []\n"
        "real = a.analyze\n"
        "def spy(*args, **kw):\n"
        "    seen.append(gc.isenabled())\n"
        "    return real(*args, **kw)\n"
        "a.analyze = spy\n"
        "from diagnostics.__main__ import main\n"
        f"code = main(['analyze', {str(trace)!r}, '-o', '/dev/null'])\n"
        "print(code, seen)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert done.stdout.split() == ["0", "[True]"]
