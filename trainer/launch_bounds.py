"""What a run launched from the app may cost: steps, workers, batch, data and wall time.

The trainer's own ranges (trainer.config) say what is valid; these say what a served app
lets anyone who can reach it start, so one form submission cannot hold the machine for a
day or fork 64 workers. The CLI (`python -m trainer run`) is the operator's own and is not
bounded. Each bound is set by an environment variable (a positive number); the defaults
cover every scenario preset with room to spare.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from trainer.config import ConfigError, TrainerConfig, get_value

# dotted config key -> (environment variable, default upper bound)
BOUND_DEFAULTS: dict[str, tuple[str, int]] = {
    "train.steps": ("PIPELINE_DOCTOR_MAX_STEPS", 5_000),
    "train.pretrain_steps": ("PIPELINE_DOCTOR_MAX_PRETRAIN_STEPS", 1_000),
    "train.batch_size": ("PIPELINE_DOCTOR_MAX_BATCH_SIZE", 1_024),
    "data.num_workers": ("PIPELINE_DOCTOR_MAX_WORKERS", 8),
    "data.rows": ("PIPELINE_DOCTOR_MAX_ROWS", 200_000),
}
# Wall time of one launched run; the trainer stops cleanly at it (train.max_runtime_s,
# status cancelled with the budget as the reason, a checkpoint kept for resume).
RUNTIME_ENV, RUNTIME_DEFAULT_S = "PIPELINE_DOCTOR_MAX_RUNTIME_S", 3_600
# Training processes started on this host for one run (torchrun's --nproc-per-node); each
# brings its own data.num_workers workers. Other nodes of a multi-node job run their own
# command, on their own machines.
PROCESSES_ENV, PROCESSES_DEFAULT = "PIPELINE_DOCTOR_MAX_PROCESSES", 8


@dataclass(frozen=True)
class LaunchBounds:
    limits: Mapping[str, tuple[str, int]]  # key -> (env var, bound)
    max_runtime_s: int
    max_processes: int = PROCESSES_DEFAULT

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> LaunchBounds:
        """Raises ConfigError naming the variable for a value that is not a positive integer."""
        limits = {
            key: (env, _positive(environ, env, default))
            for key, (env, default) in BOUND_DEFAULTS.items()
        }
        return cls(
            limits,
            _positive(environ, RUNTIME_ENV, RUNTIME_DEFAULT_S),
            _positive(environ, PROCESSES_ENV, PROCESSES_DEFAULT),
        )

    def check(self, config: TrainerConfig) -> dict[str, str]:
        """Field -> one-line message for each value above its bound (empty when within)."""
        errors = {}
        for key, (env, bound) in self.limits.items():
            value = get_value(config, key)
            if value > bound:
                errors[key] = str(
                    ConfigError(
                        key,
                        f"{value:,} is above this server's launch limit",
                        f"<= {bound:,} ({env})",
                    )
                )
        return errors

    def check_processes(self, nproc_per_node: int) -> dict[str, str]:
        """{"nproc_per_node": message} when more processes than this server allows."""
        if nproc_per_node <= self.max_processes:
            return {}
        message = ConfigError(
            "processes per node",
            f"{nproc_per_node:,} is above this server's launch limit",
            f"<= {self.max_processes:,} ({PROCESSES_ENV})",
        )
        return {"nproc_per_node": str(message)}

    def runtime_s(self, requested: float | None) -> float:
        """The run's wall-time budget: the one asked for, capped at the bound."""
        return float(
            self.max_runtime_s if requested is None else min(requested, self.max_runtime_s)
        )


def _positive(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(name, f"{raw!r} is not a positive whole number", "1 or more")
    return value
