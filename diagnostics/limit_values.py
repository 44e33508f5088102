"""The limits a user may set, and the one strict reading of each (flag or environment).

``float("nan")`` and ``float("inf")`` parse, and then fail far away: ``int(nan * 2**20)``
was a 16-line traceback. Each limit here has its bounds: a value must be a finite number
(a whole one where it counts things), at least a minimum that still means something and
at most a maximum past which it is no longer a limit (and past which the code that uses
it would overflow: a wait longer than ``threading.TIMEOUT_MAX``, bytes beyond an int64).
Anything else is refused with one line naming the flag or variable. Standard library
only: the CLI reads these before it imports the analyser.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class LimitSpec:
    """One limit: its flag, its variable, its unit and the values that mean something."""

    flag: str | None
    env: str
    unit: str
    minimum: float
    maximum: float
    whole: bool = False  # counts things: 2.5 events is a mistake, not a limit
    minimum_words: str = ""  # the minimum as the refusal says it, when not just the number

    def bounds(self) -> str:
        low = self.minimum_words or f"{_number(self.minimum)} {self.unit}"
        return f"between {low} and {_number(self.maximum)} {self.unit}"


def _number(value: float) -> str:
    return f"{int(value):,}" if value == int(value) else f"{value:g}"


MIB = 2**20
# 1 PiB: no input comes near it, and a byte count below it fits an int64 many times over
_MOST_MIB = 2.0**30

MAX_DECOMPRESSED_MB = LimitSpec(
    "--max-decompressed-mb",
    "PIPELINE_DOCTOR_MAX_DECOMPRESSED_MB",
    "MiB",
    minimum=1 / MIB,
    maximum=_MOST_MIB,
    minimum_words="1 byte",
)
# a trillion events is ~500 TB of event table at 0.5 KB an event (diagnostics.trace.budget)
MAX_EVENTS = LimitSpec("--max-events", "PIPELINE_DOCTOR_MAX_EVENTS", "events", 1, 1e12, whole=True)
# below 1 MiB not even the interpreter starts; the child's refusal would name the limit
# anyway, but a value that small is a unit mistake (bytes or KiB for MiB)
ANALYSIS_MEMORY_MB = LimitSpec(
    "--max-memory-mb", "PIPELINE_DOCTOR_ANALYSIS_MEMORY_MB", "MiB", 1, _MOST_MIB
)
# a week: longer is no time limit at all, and threading refuses waits past TIMEOUT_MAX
ANALYSIS_TIMEOUT_S = LimitSpec(
    "--timeout-s", "PIPELINE_DOCTOR_ANALYSIS_TIMEOUT_S", "s", 0.001, 7 * 24 * 3600.0
)
# each child may use the whole memory limit: more than 64 at once is no bound on a server
MAX_ANALYSES = LimitSpec(None, "PIPELINE_DOCTOR_MAX_ANALYSES", "analyses", 1, 64, whole=True)

ALL_LIMITS = (
    MAX_DECOMPRESSED_MB,
    MAX_EVENTS,
    ANALYSIS_MEMORY_MB,
    ANALYSIS_TIMEOUT_S,
    MAX_ANALYSES,
)


def parse_limit(raw: str, spec: LimitSpec) -> float:
    """``raw`` as a value of ``spec``; ValueError with what is wrong (without the name)."""
    text = raw.strip()
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{raw!r} is not a finite number")
    if spec.whole and value != int(value):
        raise ValueError(f"{raw!r} is not a whole number of {spec.unit}")
    if value <= 0:
        raise ValueError(f"{raw!r} must be positive: give a value {spec.bounds()}")
    if not spec.minimum <= value <= spec.maximum:
        raise ValueError(f"{raw!r} is out of range: give a value {spec.bounds()}")
    return int(value) if spec.whole else value


def limit_from_env(
    spec: LimitSpec, default: float, environ: Mapping[str, str] | None = None
) -> float:
    """The variable's value, else ``default``; ValueError ``NAME='raw' is ...`` when set
    to something that is not a value of ``spec``."""
    environ = os.environ if environ is None else environ
    raw = environ.get(spec.env)
    if raw is None or not raw.strip():
        return default
    try:
        return parse_limit(raw, spec)
    except ValueError as exc:
        raise ValueError(f"{spec.env}={exc}") from None


def flag_type(spec: LimitSpec):  # noqa: ANN201 - an argparse ``type``
    """An argparse ``type`` for the flag: its refusal is argparse's one usage line."""
    import argparse

    def parse(raw: str) -> float:
        try:
            return parse_limit(raw, spec)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = spec.unit  # argparse names the type in some messages
    return parse
