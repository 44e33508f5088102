"""The Dockerfile's targets, without a Docker engine: each stage's USER, ENV and CMD are read
from the file and the production CMD is run here, with that ENV, as the container would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.app.conftest import REPO_ROOT, _free_port


def stages() -> dict[str, list[tuple[str, str]]]:
    """target -> [(instruction, arguments)], continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (REPO_ROOT / "Dockerfile").read_text())
    result: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        if instruction == "FROM":
            current = args.split(" AS ")[-1].strip()
            result[current] = []
        elif current is not None:
            result[current].append((instruction, args.strip()))
    return result


def env_of(target: str) -> dict[str, str]:
    """ENV of a target and of the stages it is built FROM (base)."""
    env: dict[str, str] = {}
    for stage in ("base", target):
        for instruction, args in stages()[stage]:
            if instruction == "ENV":
                env.update(dict(re.findall(r"(\w+)=(\S+)", args)))
    return env


def last(target: str, instruction: str) -> str:
    return [args for name, args in stages()[target] if name == instruction][-1]


def test_both_targets_run_as_the_unprivileged_user():
    for target in ("production", "development"):
        assert last(target, "USER") == "10001:10001", target


def test_development_runs_jupyterlab_on_loopback_with_a_token():
    command = " ".join(json.loads(last("development", "CMD")))
    assert "--allow-root" not in command
    assert "0.0.0.0" not in command and '--ip="$JUPYTER_IP"' in command
    assert env_of("development")["JUPYTER_IP"] == "127.0.0.1"
    assert "token" not in command.lower()  # Jupyter's own token (or JUPYTER_TOKEN) stays on


def _run_production(extra_env: dict[str, str], port: int) -> subprocess.Popen[str]:
    command = json.loads(last("production", "CMD"))
    assert command[:2] == ["python", "scripts/serve.py"]
    command = [sys.executable, *command[1:]]
    command[command.index("--port") + 1] = str(port)  # the container's 8501, free here
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_DOCTOR_")}
    env = {**clean, **env_of("production"), **extra_env}
    return subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_production_refuses_to_serve_without_authentication(tmp_path):
    assert env_of("production")["PIPELINE_DOCTOR_ADDRESS"] == "0.0.0.0"
    process = _run_production(
        {"HOME": str(tmp_path), "PIPELINE_DOCTOR_RUNS_DIR": str(tmp_path)}, _free_port()
    )
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "refusing to serve on 0.0.0.0 without authentication" in stderr


@pytest.mark.slow
def test_production_serves_with_a_token(tmp_path):
    port = _free_port()
    process = _run_production(
        {
            "HOME": str(tmp_path),
            "PIPELINE_DOCTOR_RUNS_DIR": str(tmp_path),
            "PIPELINE_DOCTOR_TOKEN": "a-token-long-enough-for-prod",
        },
        port,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, "no answer from the health endpoint"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
                break
            except OSError:
                time.sleep(0.3)
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert "authentication: shared token from PIPELINE_DOCTOR_TOKEN" in stderr


def test_each_target_installs_its_dependencies_before_it_copies_the_code():
    # a code-only change then rebuilds the COPY layers and no pip install (docs/CI.md)
    for target in ("production", "development"):
        steps = stages()[target]
        code_at = next(
            i for i, (name, args) in enumerate(steps) if name == "COPY" and "--from=code" in args
        )
        installs = [i for i, (name, args) in enumerate(steps) if name == "RUN" and "pip" in args]
        assert installs and max(installs) < code_at, (target, steps)
        later = [args for name, args in steps[code_at:] if name == "RUN"]
        assert later == [], (target, later)  # nothing re-run per code change (no chown -R)


def test_the_code_stage_holds_every_package_the_app_imports():
    copied = {args.split()[0] for name, args in stages()["code"] if name == "COPY"}
    packages = {p.name for p in REPO_ROOT.iterdir() if (p / "__init__.py").exists()}
    packages -= {"tests", "bench"}  # the development target's own COPY lines
    assert packages <= copied, packages - copied
    assert {"app.py", "scripts/serve.py", ".streamlit"} <= copied
