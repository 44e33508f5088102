"""Fixtures for the app tests: real runs, a live `streamlit run`, a headless Chromium.

The server runs the real app.py on 127.0.0.1 with a free port and its own runs folder;
the browser is Debian's /usr/bin/chromium driven through Playwright (never downloaded).
"""

from __future__ import annotations

import contextlib
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


def start_trainer(runs_dir: Path, *args: str) -> subprocess.Popen[str]:
    """Starts the real reference trainer (`python -m trainer run`) as its own process."""
    env = {**os.environ, "PIPELINE_DOCTOR_RUNS_DIR": str(runs_dir)}
    return subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", "--runs-dir", str(runs_dir), *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish_trainer(process: subprocess.Popen[str], timeout_s: float = 240.0) -> Path:
    """Waits for a trainer to exit cleanly; returns its run folder (stdout's last line)."""
    stdout, stderr = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, stderr[-2000:]
    return Path(stdout.strip().splitlines()[-1])


# A small, quick reference run whose loader is slow enough (20 ms of simulated storage
# latency per sample) that data wait dominates even on a busy machine.
QUICK_RUN: dict[str, object] = {
    "train.pretrain_steps": 0,
    "data.rows": 256,
    "data.sample_latency_ms": 20,
    "model.hidden_size": 64,
    "model.intermediate_size": 128,
    "model.layers": 1,
    "profiler.wait": 1,
    "profiler.active": 2,
}


@dataclass(frozen=True)
class TrainedRuns:
    runs_dir: Path
    slow: Path  # slow-loader
    fixed: Path  # the same with the too-few-workers patch, linked as its re-run


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory: pytest.TempPathFactory) -> TrainedRuns:
    """Two short real runs: slow-loader and its re-run with more workers (linked)."""
    runs_dir = tmp_path_factory.mktemp("runs")
    common = ["--steps", "6", "--device", "cpu"]
    for key, value in QUICK_RUN.items():
        common += ["--set", f"{key}={value}"]
    # both at once (they are independent) to halve the wait; the re-run's link to the
    # first is by id, fixed up front
    slow_id, fixed_id = "slow-loader-first", "slow-loader-with-fix"
    slow_process = start_trainer(
        runs_dir, "--scenario", "slow-loader", "--run-id", slow_id, *common
    )
    fixed_process = start_trainer(
        runs_dir,
        "--scenario",
        "slow-loader",
        "--run-id",
        fixed_id,
        *common,
        "--set",
        "data.num_workers=2",
        "--parent-run-id",
        slow_id,
        "--patch-json",
        '{"data.num_workers": 2}',
    )
    slow, fixed = finish_trainer(slow_process), finish_trainer(fixed_process)
    return TrainedRuns(runs_dir, slow, fixed)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class AppServer:
    url: str
    runs_dir: Path


@contextlib.contextmanager
def served(
    command: list[str], *, port: int, cwd: Path, env: dict[str, str], log_path: Path
) -> Iterator[str]:
    """Runs ``command`` (a server on ``port``) until it answers its health check and yields
    its URL; stopped after the ``with`` block (killed if it lingers). Its output goes to
    ``log_path``, whose tail is the failure's message when it exits or never gets healthy."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 90
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"the server exited early:\n{log_path.read_text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the server did not become healthy:\n{log_path.read_text()[-3000:]}"
                    )
                try:
                    with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                        break
                except OSError:
                    time.sleep(0.3)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def serving(runs_dir: Path, log_path: Path) -> Iterator[AppServer]:
    """`streamlit run app.py` on ``runs_dir`` for the ``with`` block."""
    port = _free_port()
    command = [sys.executable, "-m", "streamlit", "run", "app.py"]
    command += ["--server.address", "127.0.0.1", "--server.port", str(port)]
    command += ["--server.headless", "true", "--browser.gatherUsageStats", "false"]
    command += ["--server.fileWatcherType", "none"]
    env = {**os.environ, "PIPELINE_DOCTOR_RUNS_DIR": str(runs_dir)}
    with served(command, port=port, cwd=REPO_ROOT, env=env, log_path=log_path) as url:
        yield AppServer(url, runs_dir)


@pytest.fixture(scope="module")
def app_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """`streamlit run app.py` on a free port with an empty runs folder; stopped after."""
    base = tmp_path_factory.mktemp("server")
    runs_dir = base / "runs"
    runs_dir.mkdir()
    with serving(runs_dir, base / "streamlit.log") as server:
        yield server


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


def wait_for_skeletons(page, timeout_ms: int = 60_000) -> None:
    """Code blocks and tables load their renderer lazily and show a grey skeleton first.
    Only visible ones count: a table in a tab not shown keeps its skeleton until opened.
    A long page on a busy machine takes a while: code blocks in findings load one by one."""
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-testid^=\"stSkeleton\"]')]"
        ".every(el => el.offsetParent === null)",
        timeout=timeout_ms,
    )


def screenshot(page, name: str, *, full_page: bool = True) -> Path:
    """A PNG of the page. Streamlit scrolls inside its main block, not the document, so a
    full-page shot first grows the viewport to the content's height."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.mouse.move(0, 0)  # no tooltip left open by the last field touched
    size = page.viewport_size
    if full_page:
        height = page.evaluate(
            "() => { const m = document.querySelector('[data-testid=\"stMain\"]');"
            " return Math.max(m ? m.scrollHeight : 0, document.body.scrollHeight); }"
        )
        page.set_viewport_size(
            {"width": size["width"], "height": min(max(height, size["height"]), 8000)}
        )
        page.wait_for_timeout(1500)  # charts re-lay out to the new size
    wait_for_skeletons(page)
    page.screenshot(path=str(path))
    if full_page:
        page.set_viewport_size(size)
    return path
