from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def shared_traces_dir() -> Path:
    return REPO_ROOT.parent / "shared" / "traces"
