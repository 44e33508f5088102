"""Serves the app: decides who may use it before streamlit starts, then execs streamlit.

    python scripts/serve.py [--address A] [--port P] [extra `streamlit run` options]

The bind address is ``--address``, else PIPELINE_DOCTOR_ADDRESS, else 127.0.0.1; the port
is ``--port``, else PORT, else 8501. Authentication is OIDC (``[auth]`` in
.streamlit/secrets.toml) or a shared token (PIPELINE_DOCTOR_TOKEN). With neither, a
loopback address serves a local tool, and any other address is refused (exit 2) unless
PIPELINE_DOCTOR_ALLOW_ANONYMOUS=1, which serves read-only with a warning in the log. The
rule itself is app_ui.access, which the pages apply again.
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


def _secrets_files() -> list[Path]:
    # where Streamlit looks by default (its `secrets.files` option), in its order
    return [Path.home() / ".streamlit" / "secrets.toml", PROJECT_ROOT / ".streamlit/secrets.toml"]


def _log(message: str) -> None:
    print(f"pipeline-doctor serve: {message}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=os.environ.get("PIPELINE_DOCTOR_ADDRESS"))
    parser.add_argument("--port", default=os.environ.get("PORT", "8501"))
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
    command = [sys.executable, "-m", "streamlit", "run", str(PROJECT_ROOT / "app.py")]
    command += ["--server.address", address, "--server.port", str(args.port)]
    command += ["--server.headless", "true", "--browser.gatherUsageStats", "false", *extra]
    os.chdir(PROJECT_ROOT)  # .streamlit/config.toml is read from the working directory
    os.execv(sys.executable, command)
    return 0  # not reached: exec replaces this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
