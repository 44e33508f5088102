"""Serves the app: decides who may use it before streamlit starts, then execs streamlit.

    python scripts/serve.py [--address A] [--port P] [--runs-dir DIR] [--scripts-dir DIR]
                            [extra `streamlit run` options]
    pipeline-doctor app [the same options]

The bind address is ``--address``, else PIPELINE_DOCTOR_ADDRESS, else 127.0.0.1; the port
is ``--port``, else PORT, else 8501. Authentication is OIDC (``[auth]`` in
.streamlit/secrets.toml) or a shared token (PIPELINE_DOCTOR_TOKEN). With neither, a
loopback address serves a local tool, and any other address is refused (exit 2) unless
PIPELINE_DOCTOR_ALLOW_ANONYMOUS=1, which serves read-only with a warning in the log. The
rule itself is app_ui.access, which the pages apply again.

The runs folder is ``--runs-dir``, else PIPELINE_DOCTOR_RUNS_DIR, else ./runs; scripts may
be launched from ``--scripts-dir``, else PIPELINE_DOCTOR_SCRIPTS_DIR, else from nowhere.
``pipeline-doctor app`` passes the folder it was started in (``--from-folder``), as
``tensorboard --logdir`` meets its writers: its ./runs is where ``pipeline-doctor profile``
run there writes, and its scripts may be launched (Re-run with fix) when the app is a
local tool, on a loopback address without sign-in; never on any other address unless
``--scripts-dir`` names a folder.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT))

from app_ui import access  # noqa: E402
from diagnostics.runs import RUNS_DIR_ENV  # noqa: E402
from trainer.script_launch import SCRIPTS_DIR_ENV  # noqa: E402


def _secrets_files() -> list[Path]:
    # where Streamlit looks by default (its `secrets.files` option), in its order
    return [Path.home() / ".streamlit" / "secrets.toml", PROJECT_ROOT / ".streamlit/secrets.toml"]


def _log(message: str) -> None:
    print(f"pipeline-doctor serve: {message}", file=sys.stderr, flush=True)


def _folders(args: argparse.Namespace, mode: str) -> dict[str, str]:
    """The runs and scripts folders as absolute paths for the app's environment (the app
    runs from the project root, so a relative path is resolved here, where it was meant)."""
    here = args.from_folder or Path.cwd()
    runs = args.runs_dir or Path(os.environ.get(RUNS_DIR_ENV) or here / "runs")
    if runs.exists() and not runs.is_dir():
        raise ValueError(f"--runs-dir: {runs} is not a folder")
    folders = {RUNS_DIR_ENV: str(runs.expanduser().resolve())}
    scripts = args.scripts_dir
    if scripts is None and not os.environ.get(SCRIPTS_DIR_ENV):
        # `pipeline-doctor app`'s own folder, for the local tool only: a served app's
        # visitors may run nothing unless the operator names a folder
        scripts = args.from_folder if mode == "local" else None
    if scripts is not None:
        if not scripts.is_dir():
            raise ValueError(f"--scripts-dir: {scripts} is not a folder")
        folders[SCRIPTS_DIR_ENV] = str(scripts.expanduser().resolve())
    return folders


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="pipeline-doctor app" if "--from-folder" in argv else None,
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "--address",
        default=os.environ.get("PIPELINE_DOCTOR_ADDRESS"),
        help="bind address (default $PIPELINE_DOCTOR_ADDRESS or 127.0.0.1)",
    )
    parser.add_argument(
        "--port", default=os.environ.get("PORT", "8501"), help="default $PORT or 8501"
    )
    parser.add_argument("--runs-dir", type=Path, help="default $PIPELINE_DOCTOR_RUNS_DIR or ./runs")
    parser.add_argument(
        "--scripts-dir",
        type=Path,
        help="the folder whose scripts may be launched (default $PIPELINE_DOCTOR_SCRIPTS_DIR; "
        "`pipeline-doctor app`: the folder it runs in, on a loopback address)",
    )
    parser.add_argument("--from-folder", type=Path, help=argparse.SUPPRESS)
    args, extra = parser.parse_known_args(argv)
    if any(arg.startswith("--server.address") for arg in extra):
        _log("give the bind address with --address (it decides whether sign-in is required)")
        return 2
    address = args.address or "127.0.0.1"
    try:
        secrets = access.read_secrets(_secrets_files())
    except (OSError, ValueError) as exc:  # tomllib's TOMLDecodeError is a ValueError
        _log(f"cannot read secrets.toml: {exc}")
        return 2
    decision = access.decide(address, os.environ, secrets)
    if decision.mode == "refused":
        _log(decision.message)
        return 2
    if decision.mode == "oidc" and importlib.util.find_spec("authlib") is None:
        _log(
            "[auth] is configured in secrets.toml but Authlib is not installed (pip install Authlib)"
        )
        return 2
    _log(decision.message)
    try:
        folders = _folders(args, decision.mode)
    except ValueError as exc:
        _log(str(exc))
        return 2
    os.environ.update(folders)
    _log(f"runs folder: {folders[RUNS_DIR_ENV]}")
    scripts = os.environ.get(SCRIPTS_DIR_ENV)
    _log(f"scripts may be launched from {scripts}" if scripts else "script runs are off")
    command = [sys.executable, "-m", "streamlit", "run", str(PROJECT_ROOT / "app.py")]
    command += ["--server.address", address, "--server.port", str(args.port)]
    command += ["--server.headless", "true", "--browser.gatherUsageStats", "false", *extra]
    os.chdir(PROJECT_ROOT)  # .streamlit/config.toml is read from the working directory
    os.execv(sys.executable, command)
    return 0  # not reached: exec replaces this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
