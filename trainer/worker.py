"""One rank's whole life under torchrun (``python -m trainer _worker``): join, train, end.

Apart from trainer/distributed.py because it runs the loop, and the loop imports that
module: keeping both in one made an import circle.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch.distributed as dist

from diagnostics.runs import LOG_FILE, RunFolder, rank_file
from trainer.config import TrainerConfig
from trainer.distributed import RankWriter, init_rank, record_ranks
from trainer.logs import setup_logging
from trainer.loop import Trainer
from trainer.run_io import CACHE_DIR_NAME
from trainer.runtime import StopRequests

log = logging.getLogger("trainer")


def worker_main(run_dir: Path, resume: bool) -> int:
    """One rank's whole life: join, train, write its status. Exit 1 when it failed."""
    config = TrainerConfig.from_dict(RunFolder(run_dir).manifest().config)
    rank = int(os.environ.get("RANK", "0"))
    setup_logging(run_dir / rank_file(LOG_FILE, rank), role=f"rank {rank}")
    writer = RankWriter(run_dir, rank)
    stop = StopRequests()
    stop.install()
    status, reason, step = "failed", None, 0
    try:
        ctx, device = init_rank(config)
        record_ranks(ctx, run_dir)
        log.info("rank %d of %d (%s) on %s", ctx.rank, ctx.world_size, ctx.backend, device)
        trainer = Trainer(
            config, writer, device=device, cache_dir=run_dir.parent / CACHE_DIR_NAME, stop=stop
        )
        outcome = trainer.run(resume_latest=resume)
        status, reason, step = outcome.status, outcome.reason, outcome.steps_done
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        log.exception("rank %d failed", rank)
    finally:
        stop.uninstall()
    writer.finalise(status, reason, step)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 1 if status == "failed" else 0
