"""Python stack frames of a trace recorded with ``with_stack=True``: which of them are the
user's own code, and the innermost such frame around a host call.

Kineto writes each Python call as a ``python_function`` range on the calling thread, named
``<path>(<line>): <function>``, nested by time. The path is as recorded: relative to the
``sys.path`` entry it was found under (``train.py``, ``torch/nn/modules/module.py``,
``transformers/...``) or absolute. The line is the one the frame was on when the tracer first
saw it: a function's first line for calls made while profiling, the running line for frames
already on the stack when profiling began (the script's ``<module>``). The line of the call
inside the function is not recorded.

A frame is library code when its path lies under ``site-packages``/``dist-packages`` or a
Python install's ``lib/pythonX.Y``, when its first path component is a standard-library
module or a known framework (torch, transformers, lightning, ... and this project's
``probe`` instruments), or when it is not a file at all (``<built-in ...>``, ``<string>``,
``<frozen os>``, ``nn.Module: ...``). Everything else is the user's, the reference
trainer's ``trainer/loop.py`` included: a trace alone cannot know more.
"""

from __future__ import annotations

import re
import sys

import polars as pl

from diagnostics.facts.selectors import select_where
from diagnostics.trace.schema import Category

# Frameworks that sit between the user's line and a sync: a site inside them would name the
# library, not the line to change.
FRAMEWORK_ROOTS: frozenset[str] = frozenset(
    {
        "torch",
        "torchvision",
        "torchaudio",
        "torchtext",
        "torchdata",
        "functorch",
        "triton",
        "transformers",
        "accelerate",
        "datasets",
        "tokenizers",
        "safetensors",
        "huggingface_hub",
        "peft",
        "trl",
        "timm",
        "lightning",
        "pytorch_lightning",
        "lightning_fabric",
        "lightning_utilities",
        "torchmetrics",
        "deepspeed",
        "apex",
        "fairscale",
        "xformers",
        "flash_attn",
        "einops",
        "numpy",
        "tqdm",
        "wandb",
        "tensorboard",
        "vllm",
        "probe",  # this project's instruments: their hooks run inside the user's step
    }
)
LIBRARY_ROOTS: frozenset[str] = frozenset(sys.stdlib_module_names) | FRAMEWORK_ROOTS

FRAME_PATTERN = r"^(.+)\((\d+)\): (.+)$"
_INSTALL_DIR = re.compile(r"(^|/)(site-packages|dist-packages|lib/python\d+\.\d+)/")

FRAME_SCHEMA: dict[str, pl.DataType] = {
    "pid": pl.Int64,
    "tid": pl.Int64,
    "start_us": pl.Float64,
    "end_us": pl.Float64,
    "frame": pl.String,
    "file": pl.String,
    "line": pl.Int64,
    "function": pl.String,
}


def is_library_path(path: str) -> bool:
    """True when ``path`` (as a python_function name writes it) is not the user's code."""
    if path.startswith("<") or _INSTALL_DIR.search(path):
        return True
    if path.startswith("/"):
        return False
    root = path.split("/", 1)[0]
    return root.removesuffix(".py") in LIBRARY_ROOTS


def has_python_stacks(events: pl.DataFrame) -> bool:
    return bool(events.height) and events["cat"].eq(Category.PYTHON_FUNCTION).any()


def user_frames(events: pl.DataFrame) -> pl.DataFrame:
    """pid, tid, start_us, end_us, frame (the recorded name), file, line, function of every
    python_function range that is the user's code."""
    frames = select_where(
        events,
        (pl.col("cat") == Category.PYTHON_FUNCTION) & pl.col("dur").is_not_null(),
        "pid",
        "tid",
        pl.col("ts").alias("start_us"),
        (pl.col("ts") + pl.col("dur")).alias("end_us"),
        pl.col("name").alias("frame"),
        pl.col("name").str.extract_groups(FRAME_PATTERN).alias("_parts"),
    )
    frames = frames.unnest("_parts").rename({"1": "file", "2": "line", "3": "function"})
    frames = frames.filter(pl.col("file").is_not_null())
    if frames.height == 0:
        return pl.DataFrame(schema=FRAME_SCHEMA)
    library = frames["file"].unique().to_list()
    library = [path for path in library if is_library_path(path)]
    return (
        frames.filter(~pl.col("file").is_in(library))
        .with_columns(pl.col("line").cast(pl.Int64))
        .select(list(FRAME_SCHEMA))
        .cast(FRAME_SCHEMA)
    )


def innermost_user_frame(calls: pl.DataFrame, frames: pl.DataFrame) -> pl.DataFrame:
    """``calls`` (call_id, pid, tid, start_us) with the innermost user frame that was open
    on the same thread when the call began: frame, file, line, function (null when none).

    Frames on one thread nest, so of those open at the call's start the innermost is the
    one that began last (the shorter on a tie)."""
    keys = calls.select("call_id", "pid", "tid", pl.col("start_us").alias("_at"))
    found = keys.join(frames, on=["pid", "tid"], how="inner").filter(
        (pl.col("start_us") <= pl.col("_at")) & (pl.col("end_us") > pl.col("_at"))
    )
    innermost = (
        found.sort(["call_id", "start_us", "end_us"], descending=[False, True, False])
        .unique(subset="call_id", keep="first")
        .select("call_id", "frame", "file", "line", "function")
    )
    return calls.join(innermost, on="call_id", how="left")
