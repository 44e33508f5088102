"""Real traces for the drill-down tests, each loaded once per session, and a stdlib oracle."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from diagnostics.drilldown import DrillDown, build_drilldown
from diagnostics.trace.loader import load_trace_file

SHARED = Path(__file__).resolve().parents[3].parent / "shared"
LARGE_V100 = SHARED / "traces" / "hta_v100_rank1_of_2_large.json.gz"  # ~54 MB decompressed
H200_BF16 = next((SHARED / "gpu-runs" / "h200-sized" / "m768l6b256" / "trace").glob("*.json.gz"))


def raw_events(path: Path) -> list[dict]:
    """The independent oracle: the file read with gzip + json."""
    with gzip.open(path) as handle:
        return json.load(handle)["traceEvents"]


@pytest.fixture(scope="session")
def large_drill() -> DrillDown:
    return build_drilldown(load_trace_file(LARGE_V100))


@pytest.fixture(scope="session")
def h200_drill() -> DrillDown:
    return build_drilldown(load_trace_file(H200_BF16))


@pytest.fixture(scope="session")
def large_raw() -> list[dict]:
    return raw_events(LARGE_V100)


@pytest.fixture(scope="session")
def h200_raw() -> list[dict]:
    return raw_events(H200_BF16)
