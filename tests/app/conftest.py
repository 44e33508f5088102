"""Fixtures for the app tests: real runs, a live `streamlit run`, a headless Chromium.

The server runs the real app.py on 127.0.0.1 with a free port and its own runs folder;
the browser is Debian's /usr/bin/chromium driven through Playwright (never downloaded).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = REPO_ROOT / "test-artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="session")
def shared_traces_dir() -> Path:
    return REPO_ROOT.parent / "shared" / "traces"


def run_trainer(runs_dir: Path, *args: str, timeout_s: float = 240.0) -> Path:
    """Runs the real reference trainer to completion; returns the run folder."""
    env = {**os.environ, "PIPELINE_DOCTOR_RUNS_DIR": str(runs_dir)}
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "run", "--runs-dir", str(runs_dir), *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class TrainedRuns:
    runs_dir: Path
    slow: Path  # slow-loader
    fixed: Path  # the same with the too-few-workers patch, linked as its re-run


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory: pytest.TempPathFactory) -> TrainedRuns:
    """Two short real runs: slow-loader and its re-run with more workers (linked)."""
    runs_dir = tmp_path_factory.mktemp("runs")
    common = (
        "--steps",
        "6",
        "--device",
        "cpu",
        "--set",
        "profiler.wait=1",
        "--set",
        "profiler.active=2",
    )
    slow = run_trainer(runs_dir, "--scenario", "slow-loader", *common)
    fixed = run_trainer(
        runs_dir,
        "--scenario",
        "slow-loader",
        *common,
        "--set",
        "data.num_workers=2",
        "--parent-run-id",
        slow.name,
        "--patch-json",
        '{"data.num_workers": 2}',
    )
    return TrainedRuns(runs_dir, slow, fixed)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class AppServer:
    url: str
    runs_dir: Path


def start_server(runs_dir: Path, log_path: Path) -> tuple[subprocess.Popen[bytes], AppServer]:
    port = _free_port()
    env = {**os.environ, "PIPELINE_DOCTOR_RUNS_DIR": str(runs_dir)}
    log = log_path.open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            "app.py",
            "--server.address",
            "127.0.0.1",
            "--server.port",
            str(port),
            "--server.headless",
            "true",
            "--browser.gatherUsageStats",
            "false",
            "--server.fileWatcherType",
            "none",
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"streamlit exited early:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return process, AppServer(url, runs_dir)
        except OSError:
            time.sleep(0.3)
    process.terminate()
    raise RuntimeError(f"streamlit did not become healthy:\n{log_path.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def app_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """`streamlit run app.py` on a free port with an empty runs folder; stopped after."""
    base = tmp_path_factory.mktemp("server")
    runs_dir = base / "runs"
    runs_dir.mkdir()
    process, server = start_server(runs_dir, base / "streamlit.log")
    try:
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (scripts/setup.sh dev)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(30_000)
    try:
        yield page
    finally:
        context.close()


def screenshot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
