"""Snapshot the findings (rule, severity, title) on every shared trace and run folder.

Used to show that a refactor leaves behaviour unchanged: run it before and after,
then diff the two files.

    .venv/bin/python scripts/findings_snapshot.py /tmp/before.txt
    ... change ...
    .venv/bin/python scripts/findings_snapshot.py /tmp/after.txt
    diff /tmp/before.txt /tmp/after.txt

Run it from another checkout (``cd old && python new/scripts/findings_snapshot.py ...``) to
snapshot that checkout's analyser: the analyser is run from the current directory.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

SHARED = Path(__file__).resolve().parent.parent.parent / "shared"


def inputs(shared: Path) -> list[Path]:
    traces = sorted((shared / "traces").glob("*.json.gz"))
    runs = sorted(p for p in (shared / "gpu-runs").glob("*/*") if p.is_dir())
    return traces + runs


def _rounded(value: object) -> object:
    """Floats to 9 significant digits: polars' parallel sums differ in the last bits run to run."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def findings_lines(path: Path) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "diagnostics", "analyze", str(path), "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return [f"{path.name}\tEXIT {proc.returncode}\t{proc.stderr.strip()}"]
    result = json.loads(proc.stdout)
    lines = [f"{path.name}\t{f['rule']}\t{f['severity']}\t{f['title']}" for f in result["findings"]]
    lines += [f"{path.name}\tskipped\t{s}" for s in sorted(map(str, result.get("skipped", [])))]
    # The digest catches changes in evidence, recommendations and order, not just titles.
    whole = json.dumps(_rounded(result["findings"]), sort_keys=True).encode()
    lines.append(f"{path.name}\tfindings-sha256\t{hashlib.sha256(whole).hexdigest()[:16]}")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: findings_snapshot.py OUTPUT.txt [SHARED_DIR]", file=sys.stderr)
        return 2
    shared = Path(argv[2]) if len(argv) > 2 else SHARED
    paths = inputs(shared)
    out = [line for path in paths for line in findings_lines(path)]
    Path(argv[1]).write_text("\n".join(out) + "\n", encoding="utf-8")
    print(f"{len(out)} lines from {len(paths)} inputs -> {argv[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
