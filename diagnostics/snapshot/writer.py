"""Writes a snapshot dict where the reader (and memory_viz) will read it.

The recorder (the trainer's or a user's job, on CUDA) calls
``write_snapshot(torch.cuda.memory._snapshot(), RunFolder(path).snapshot_path(step))``.
Protocol 4: memory_viz's page reads it (it cannot read 5, pytorch #193348), and so does
the restricted reader. Written to a temporary name and renamed, so a reader never sees
half a file. This module imports no torch: the dict is passed in.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

PROTOCOL = 4


def write_snapshot(snapshot: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    with tmp.open("wb") as handle:
        pickle.dump(snapshot, handle, protocol=PROTOCOL)
    os.replace(tmp, target)
    return target
