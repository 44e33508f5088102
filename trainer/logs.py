"""The trainer's log: stderr plus the run folder's log file, set up once per process."""

from __future__ import annotations

import logging
import sys
from pathlib import Path


class _LogFile(logging.FileHandler):
    """log.txt that never prints logging's own traceback: a full disk is reported once,
    as the run's outcome, not as a "--- Logging error ---" block per message."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        pass


def setup_logging(log_path: Path, role: str | None = None) -> None:
    """The "trainer" logger to stderr and ``log_path``, replacing earlier handlers (a
    process may set up a run, then resume one). ``role`` tags every line, e.g. the
    distributed launcher's "[launcher]" beside its ranks' own lines."""
    logger = logging.getLogger("trainer")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    tag = f" [{role}]" if role else ""
    fmt = logging.Formatter(f"%(asctime)s %(levelname)s{tag} %(message)s", "%H:%M:%S")
    for handler in (logging.StreamHandler(sys.stderr), _LogFile(log_path)):
        handler.setFormatter(fmt)
        logger.addHandler(handler)
