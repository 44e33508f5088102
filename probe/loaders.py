"""DataLoaders as the user's code built them: the line, the arguments, and overrides.

``DataLoader.__init__`` is wrapped: before the loader is built, ``--override
dataloader.KEY=VALUE`` replaces the argument (so a re-run tries a fix without editing the
script); after, the loader's own attributes are recorded with the ``file:line`` of the
first frame outside torch, probe and the frameworks (the user's call), into
``dataloaders.jsonl``; ``built_by`` names the framework whose code made the call (the HF
Trainer builds its DataLoader from ``TrainingArguments``: the user's line is then
``trainer.train()``, and the fix is in those arguments, not in a call to rewrite).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import linecache
import os
import sys
import weakref
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

# frameworks that build DataLoaders on the user's behalf: Lightning wraps DataLoader.__init__
# while a LightningModule's *_dataloader() hook runs, and re-creates a loader to give it a
# DistributedSampler; HF's Trainer builds its loader from TrainingArguments and accelerate
# re-creates it as the base of its DataLoaderShard. The line to show is the user's, not
# theirs; each package maps to the framework a finding names (``built_by``)
FRAMEWORK_OF_PACKAGE = {
    "lightning": "lightning",
    "pytorch_lightning": "lightning",
    "lightning_fabric": "lightning",
    "transformers": "transformers",
    "accelerate": "accelerate",
}
FRAMEWORK_PACKAGES = tuple(FRAMEWORK_OF_PACKAGE)


def _package_root(name: str) -> str | None:
    """The folder of a top-level package, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return str(Path(locations[0]).resolve()) + os.sep if locations else None


# package folder -> framework, found once: a package that is not installed has none
_FRAMEWORK_OF_ROOT = {
    root: framework
    for package, framework in FRAMEWORK_OF_PACKAGE.items()
    if (root := _package_root(package))
}
_FRAMEWORK_ROOTS = tuple(_FRAMEWORK_OF_ROOT)


def _outside_instruments(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    resolved = str(Path(filename).resolve())
    return not resolved.startswith(_SKIPPED_ROOTS) and "runpy" not in Path(filename).name


def _in_framework(filename: str) -> bool:
    return str(Path(filename).resolve()).startswith(_FRAMEWORK_ROOTS)


def user_frame(depth: int = 2) -> tuple[str, int] | None:
    """(file, line) of the innermost caller outside torch, probe and the frameworks, if any."""
    frame = sys._getframe(depth)
    while frame is not None:
        filename = frame.f_code.co_filename
        if _outside_instruments(filename) and not _in_framework(filename):
            return str(Path(filename).resolve()), frame.f_lineno
        frame = frame.f_back
    return None


def calling_framework(depth: int = 2) -> str | None:
    """The framework (``FRAMEWORK_OF_PACKAGE``'s values) whose code is the innermost caller
    outside torch and probe; None when that caller is the user's own code."""
    frame = sys._getframe(depth)
    while frame is not None:
        filename = frame.f_code.co_filename
        if _outside_instruments(filename):
            resolved = str(Path(filename).resolve())
            for root, framework in _FRAMEWORK_OF_ROOT.items():
                if resolved.startswith(root):
                    return framework
            return None
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
        # id(dataset) -> (the dataset, weakly; the first record built on it)
        self._by_dataset: dict[int, tuple[Any, dict[str, Any]]] = {}
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
            by_framework = calling_framework()
            args, kwargs, overridden = recorder._overridden(loader, args, kwargs, site)
            loader._probe_building = True  # type: ignore[attr-defined]
            try:
                original(*args, **kwargs)
            finally:
                loader.__dict__.pop("_probe_building", None)
            recorder._record(loader, site, overridden, by_framework)

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

    def _rebuilt_from(self, dataset: Any, by_framework: str | None) -> dict[str, Any] | None:
        """The record of the loader a framework is re-creating (Lightning, for a sampler;
        accelerate, as its shard's base): one built earlier on the same dataset object.
        None for a loader of its own."""
        if not by_framework or dataset is None:
            return None
        earlier = self._by_dataset.get(id(dataset))
        if earlier is None or earlier[0]() is not dataset:
            return None
        return earlier[1]

    def _remember_dataset(self, dataset: Any, record: dict[str, Any]) -> None:
        if dataset is None or id(dataset) in self._by_dataset:
            return
        with contextlib.suppress(TypeError):  # a dataset without weak references
            self._by_dataset[id(dataset)] = (weakref.ref(dataset), record)

    def _record(
        self,
        loader: DataLoader,
        site: tuple[str, int] | None,
        overridden: dict[str, Any],
        by_framework: str | None = None,
    ) -> None:
        index = self.count
        self.count += 1
        loader._probe_index = index  # type: ignore[attr-defined]
        dataset = getattr(loader, "dataset", None)
        origin = self._rebuilt_from(dataset, by_framework)
        if origin is not None:
            # the framework passes the loader's arguments as they are now: an override
            # already applied shows no change, so the script's values are the original's
            overridden = {**origin["overridden"], **overridden}
        file, line = (origin["file"], origin["line"]) if origin else site if site else (None, None)
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
            # a re-created loader is the original's, built where and by whom it was
            "built_by": origin.get("built_by") if origin else by_framework,
        }
        if origin is not None:
            record["rebuilt_from"] = origin["index"]
        self._remember_dataset(dataset, record)
        self.built.append(record)
        self._sink(record)
