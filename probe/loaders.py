"""DataLoaders as the user's code built them: the line, the arguments, and overrides.

``DataLoader.__init__`` is wrapped: before the loader is built, ``--override
dataloader.KEY=VALUE`` replaces the argument (so a re-run tries a fix without editing the
script); after, the loader's own attributes are recorded with the ``file:line`` of the
first frame outside torch and probe (the user's call), into ``dataloaders.jsonl``.
"""

from __future__ import annotations

import contextlib
import inspect
import linecache
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from probe.overrides import OVERRIDE_KEYS

# arguments DataLoader refuses without worker processes
_NEEDS_WORKERS = ("persistent_workers", "prefetch_factor")

_SKIPPED_ROOTS = tuple(
    str(Path(module.__file__).resolve().parent) + os.sep
    for module in (torch, sys.modules[__package__ or "probe"])
    if module.__file__
)


def _outside_instruments(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    resolved = str(Path(filename).resolve())
    return not resolved.startswith(_SKIPPED_ROOTS) and "runpy" not in Path(filename).name


def user_frame(depth: int = 2) -> tuple[str, int] | None:
    """(file, line) of the innermost caller outside torch and probe, if any."""
    frame = sys._getframe(depth)
    while frame is not None:
        if _outside_instruments(frame.f_code.co_filename):
            return str(Path(frame.f_code.co_filename).resolve()), frame.f_lineno
        frame = frame.f_back
    return None


def shown_site(file: str, line: int, base: Path | None) -> str:
    """``train.py:37`` for a file under ``base`` (the script's folder), else the full path."""
    path = Path(file)
    if base is not None:
        with contextlib.suppress(ValueError):
            path = path.relative_to(base)
    return f"{path}:{line}"


MAX_CALL_LINES = 12


def call_source(file: str, line: int) -> str | None:
    """The source of the call starting on ``line``: its lines until the brackets close
    (a call over several lines), dedented; None when it cannot be read."""
    lines: list[str] = []
    depth = 0
    for number in range(line, line + MAX_CALL_LINES):
        text = linecache.getline(file, number)
        if not text:
            break
        lines.append(text.rstrip())
        depth += text.count("(") - text.count(")")
        if depth <= 0 and "(" in "".join(lines):
            break
    if not lines:
        return None
    indent = min(len(t) - len(t.lstrip()) for t in lines if t.strip())
    return "\n".join(t[indent:] for t in lines)


class LoaderRecorder:
    """Wraps ``DataLoader.__init__``; ``sink`` receives each DataLoaderRecord's fields."""

    def __init__(
        self,
        overrides: Mapping[str, Any],
        sink: Any,
        note: Any,
        base: Path | None,
    ):
        self.overrides = dict(overrides)
        self._sink = sink
        self._note = note
        self._base = base
        self.count = 0
        self.built: list[dict[str, Any]] = []  # every record, for the totals at the end
        self._original = DataLoader.__init__
        self._original_iter = DataLoader.__iter__
        self._signature = inspect.signature(self._original)

    def install(self) -> None:
        recorder = self
        original = self._original

        def __init__(loader: DataLoader, *args: Any, **kwargs: Any) -> None:
            if getattr(loader, "_probe_building", False):  # a subclass calling super()
                original(loader, *args, **kwargs)
                return
            site = user_frame()
            args, kwargs, overridden = recorder._overridden(loader, args, kwargs, site)
            loader._probe_building = True  # type: ignore[attr-defined]
            try:
                original(*args, **kwargs)
            finally:
                loader.__dict__.pop("_probe_building", None)
            recorder._record(loader, site, overridden)

        original_iter = self._original_iter

        def __iter__(loader: DataLoader) -> Any:
            iterator = original_iter(loader)
            # which loader a batch came from, for the per-loader wait at the end
            with contextlib.suppress(AttributeError):
                iterator._probe_index = getattr(loader, "_probe_index", None)
            return iterator

        __init__.__wrapped__ = original  # type: ignore[attr-defined]
        DataLoader.__init__ = __init__  # type: ignore[method-assign]
        DataLoader.__iter__ = __iter__  # type: ignore[method-assign]

    def uninstall(self) -> None:
        DataLoader.__init__ = self._original  # type: ignore[method-assign]
        DataLoader.__iter__ = self._original_iter  # type: ignore[method-assign]

    def totals(self, waits: dict[Any, list[float]]) -> list[dict[str, Any]]:
        """Each record again with its batches fetched and wait on the training thread
        (``waits``: index -> [batches, seconds]); the reader keeps a loader's last line."""
        finals = []
        for record in self.built:
            batches, seconds, cpu_seconds = waits.get(record["index"], (0, 0.0, 0.0))
            finals.append(
                {
                    **record,
                    "batches": int(batches),
                    "wait_ms": seconds * 1e3,
                    "wait_cpu_ms": cpu_seconds * 1e3,
                }
            )
        return finals

    def _overridden(
        self,
        loader: DataLoader,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        site: tuple[str, int] | None,
    ) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
        """(args, kwargs) for the original ``__init__`` (``self`` first), and for each
        argument replaced, the value the script passed."""
        if not self.overrides:
            return (loader, *args), kwargs, {}
        try:
            bound = self._signature.bind(loader, *args, **kwargs)
        except TypeError:  # the call is wrong anyway: DataLoader's own error says how
            return (loader, *args), kwargs, {}
        values = {
            name: bound.arguments.get(name, self._signature.parameters[name].default)
            for name in OVERRIDE_KEYS
        }
        overridden: dict[str, Any] = {}
        workers = self.overrides.get("num_workers", values["num_workers"])
        where = shown_site(*site, self._base) if site else "a DataLoader"
        for key, value in self.overrides.items():
            if key in _NEEDS_WORKERS and not workers:
                self._note(
                    f"--override dataloader.{key}={value} not applied to {where}: "
                    "the loader has no worker processes (num_workers=0)"
                )
                continue
            if values[key] != value:
                overridden[key] = values[key]
                bound.arguments[key] = value
        return bound.args, bound.kwargs, overridden

    def _record(
        self, loader: DataLoader, site: tuple[str, int] | None, overridden: dict[str, Any]
    ) -> None:
        index = self.count
        self.count += 1
        loader._probe_index = index  # type: ignore[attr-defined]
        file, line = site if site else (None, None)
        dataset = getattr(loader, "dataset", None)
        record = {
            "index": index,
            "file": file,
            "line": line,
            "site": shown_site(file, line, self._base) if file and line else None,
            "code": call_source(file, line) if file and line else None,
            "dataset_class": type(dataset).__qualname__ if dataset is not None else None,
            "batch_size": loader.batch_size,
            "num_workers": loader.num_workers,
            "pin_memory": bool(loader.pin_memory),
            "persistent_workers": bool(loader.persistent_workers),
            "prefetch_factor": loader.prefetch_factor,
            "overridden": overridden,
        }
        self.built.append(record)
        self._sink(record)
